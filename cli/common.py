"""What every command shares: the generation flags (declared once, added to a command's signature
by `generation_options`), model and profile resolution, and the error/exit-code policy."""

from __future__ import annotations

import functools
import inspect
import os
import sys
import typing
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.text import Text

from fastdllm.config import DecodeConfig, type_of
from fastdllm.errors import UsageError, UserError

# No markup parsing (user text such as a path with "[/x]" is printed as it is: styles are passed
# as arguments) and soft wrapping: a message stays one line in a pipe or file, not cut at 80 columns.
err_console = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)
out_console = Console(highlight=False, markup=False, soft_wrap=True)
DEBUG = {"on": bool(os.environ.get("FASTDLLM_DEBUG"))}

def _decode_flag(f) -> tuple[Any, Any]:
    """A DecodeConfig field as a flag: --field-name, its type (None = not given), its help."""
    kind, _ = type_of(f)
    names = ((f"--{f.name.replace('_', '-')}/--no-{f.name.replace('_', '-')}",) if kind == "bool"
             else (f"--{f.name.replace('_', '-')}", *SHORT_FLAGS.get(f.name, ())))
    text = f.metadata["help"] + (f": {' | '.join(f.metadata['choices'])}" if "choices" in f.metadata else "")
    return Optional[{"int": int, "float": float, "bool": bool, "str": str}[kind]], \
        typer.Option(*names, help=text[0].upper() + text[1:] + ".")


# name -> (type, typer.Option): every DecodeConfig field, then how to load the model.
SHORT_FLAGS = {"gen_len": ("-n",), "seed": ("-s",)}
DECODE_FLAGS = {f.name: _decode_flag(f) for f in fields(DecodeConfig)}
MODEL_FLAGS = {
    "model": (Optional[str], typer.Option("--model", "-m", help="Checkpoint directory or hub id (default: built-in model).")),
    "profile": (Optional[str], typer.Option("--profile", "-P", help="Profile name or YAML file (default: 'default').")),
    "dtype": (Optional[str], typer.Option("--dtype", help="auto | bf16 | fp16 | fp32 | fp64 (auto: bf16 on GPU, fp32 on CPU).")),
    "device": (Optional[str], typer.Option("--device", help="auto | cpu | cuda | cuda:N (auto spreads over GPUs with accelerate).")),
    "quantize": (Optional[str], typer.Option("--quantize", help="none | 8bit | 4bit (bitsandbytes).")),
}
MODEL_DEFAULTS = {"dtype": "auto", "device": "auto", "quantize": "none"}  # when neither flag nor env


@dataclass
class RunOptions:
    model: str | None
    profile: str | None
    dtype: str
    device: str
    quantize: str
    decode: dict[str, Any]          # DecodeConfig overrides from flags (None = not given)


def generation_options(func):
    """Add the model and decoding flags to a Typer command; it receives them as `opts`."""
    flags = {**MODEL_FLAGS, **DECODE_FLAGS}

    def wrapper(**kwargs):
        values = {name: kwargs.pop(name) for name in flags}
        opts = RunOptions(model=values["model"] or os.environ.get("FASTDLLM_MODEL"),
                          profile=values["profile"] or os.environ.get("FASTDLLM_PROFILE"),
                          **model_placement(**{k: values[k] for k in MODEL_DEFAULTS}),
                          decode={k: values[k] for k in DECODE_FLAGS})
        return func(opts=opts, **kwargs)

    return with_options(func, wrapper, flags, drop="opts")


def decoding_options(func):
    """Add only the decoding flags (no model or profile flags) to a Typer command; it receives them
    as `decode` (DecodeConfig overrides, None = not given)."""
    def wrapper(**kwargs):
        return func(decode={name: kwargs.pop(name) for name in DECODE_FLAGS}, **kwargs)

    return with_options(func, wrapper, DECODE_FLAGS, drop="decode")


def with_options(func, wrapper, flags: dict, drop: str | None = None):
    """Give `wrapper` the signature Typer reads: `func`'s own parameters (less `drop`) plus
    keyword options `flags` (name -> (type, typer.Option))."""
    hints = typing.get_type_hints(func, include_extras=True)   # resolved, Annotated metadata kept
    own = [p.replace(annotation=hints[p.name]) for p in inspect.signature(func).parameters.values()
           if p.name != drop]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation=Annotated[kind, option]) for name, (kind, option) in flags.items()]
    params = own + extra
    wrapper = functools.wraps(func)(wrapper)
    wrapper.__signature__ = inspect.Signature(params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def model_placement(**given: str | None) -> dict[str, str]:
    """dtype / device / quantize: the flag, else FASTDLLM_DTYPE etc., else the default; an unknown
    value is a usage error naming where it came from."""
    from fastdllm.config import placement_error

    chosen = {}
    for key, default in MODEL_DEFAULTS.items():
        env = f"FASTDLLM_{key.upper()}"
        source, value = (f"--{key}", given[key]) if given.get(key) else (env, os.environ.get(env) or default)
        if problem := placement_error(key, value):
            raise UsageError(f"{source}: {problem}")
        chosen[key] = value
    return chosen


DEBUG_FLAG = {"debug": (bool, typer.Option("--debug", help="Show Python tracebacks."))}


def user_errors(func):
    """One line on stderr and an exit code for user mistakes; 130 on Ctrl+C; tracebacks with --debug
    (accepted after the subcommand as well as before it)."""
    def wrapper(*args, debug: bool | None = None, **kwargs):
        if debug:
            DEBUG["on"] = True
        try:
            return func(*args, **kwargs)
        except UserError as e:
            if DEBUG["on"]:
                raise
            err_console.print(Text("error: ", style="bold red") + Text(str(e)))
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            if DEBUG["on"]:
                raise
            err_console.print("interrupted", style="yellow")
            raise typer.Exit(130) from None

    return with_options(func, wrapper, DEBUG_FLAG)


def resolve_model_dir(spec: str | None) -> Path:
    """--model: a local directory, a hub id (downloaded when the network allows), or the built-in model."""
    from fastdllm.builtin import builtin_model_path

    if spec is None:
        path = builtin_model_path()
        if path is None:
            raise UsageError("no model given and the built-in model is not installed: pass --model DIR")
        return path
    path = Path(spec).expanduser()
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        return path                                   # loading reports a missing/malformed directory
    return _download(spec)


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        # weights, configs and tokenizer files only: no Python file of a checkpoint is fetched
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]))
    except Exception as e:  # offline, unknown repo, auth: all end the same way for the user
        raise UserError(f"cannot fetch '{repo_id}' from the hub ({type(e).__name__}); "
                        f"download it elsewhere and pass its local directory with --model DIR") from None


def load_model(model_dir: Path, **placement: str):
    """Load with a spinner on a terminal (stderr)."""
    from fastdllm import loading

    spinner = err_console.status(Text(f"loading {model_dir.name} ...")) if err_console.is_terminal else nullcontext()
    with spinner, keys_not_echoed():
        lm = loading.load(model_dir, **placement)
    if lm.info.get("bf16") == "emulated":
        from fastdllm.cpu import bf16_note

        err_console.print(f"note: {bf16_note()}", style="yellow")
    return lm


def prepare(opts: RunOptions):
    """Resolve model dir, profile and config (before any weights are read), then load the model."""
    from fastdllm import profiles

    model_dir = resolve_model_dir(opts.model)
    profile = profiles.find(opts.profile or profiles.default_profile_for(model_dir))
    cfg = profiles.resolve(profile, opts.decode, model_dir)
    lm = load_model(model_dir, dtype=opts.dtype, device=opts.device, quantize=opts.quantize)
    trained = lm.model.attention.block
    if trained is not None and cfg.block_len != trained:
        err_console.print(f"note: blocks of {cfg.block_len}, but {model_dir.name} was trained with blocks of "
                          f"{trained}: not its authors' setting", style="yellow")
    return lm, profile, cfg


def live_view(lm, prompt_ids: list[int], cfg, header: str):
    """The live canvas of one answer on stderr, shaped like the run (canvas.geometry)."""
    from fastdllm.canvas import geometry
    from fastdllm.view import LiveCanvas

    width, offset = geometry(len(prompt_ids), cfg, lm.model.attention.kind == "block-causal")
    return LiveCanvas(err_console, lm.tokenizer, header, width, cfg.block_len, lm.specials.stops, offset=offset)


def print_columns(rows: list[tuple[str, ...]], header: tuple[str, ...] | None = None) -> None:
    """Rows for people on stdout: a rich table on a terminal (long cells folded); in a pipe or a
    file whole lines, columns padded with two spaces and the last one neither cut nor padded."""
    if out_console.is_terminal:
        from rich.table import Table

        table = Table(box=None, pad_edge=False, show_header=header is not None)
        for i, name in enumerate(header or [""] * len(rows[0])):
            table.add_column(name, overflow="fold", style="bold" if i == 0 and header is None else None)
        for row in rows:
            table.add_row(*row)
        out_console.print(table)
        return
    lines = ([header] if header else []) + rows
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
    for line in lines:
        sys.stdout.write("  ".join([c.ljust(w) for c, w in zip(line, widths)] + [line[-1]]) + "\n")


def is_terminal(stream) -> bool:
    return hasattr(stream, "isatty") and stream.isatty()


@contextmanager
def keys_not_echoed():
    """While a spinner or the live view owns the terminal, typed keys are not echoed into it (they
    stay queued for whoever reads stdin next); the terminal's settings are restored afterwards."""
    try:
        import termios

        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd) if sys.stdin.isatty() else None
    except (ImportError, AttributeError, OSError, ValueError):   # no termios (Windows), no real stdin
        saved = None
    if saved is None:
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~termios.ECHO                                     # lflags
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def utf8(data: bytes, source: str) -> str:
    """Prompt bytes as text; invalid UTF-8 is refused with the byte and its offset (never guessed:
    a prompt silently changed would give a silently different answer)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{source} is not valid UTF-8: byte 0x{data[e.start]:02x} at offset {e.start}") from None


def argument_text(text: str, source: str) -> str:
    """A command-line argument as the user's bytes meant it (Python smuggles undecodable bytes in as
    lone surrogates), checked as UTF-8."""
    return utf8(os.fsencode(text), source)

