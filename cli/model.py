"""From flags to a loaded model: the model directory, profile and config resolved before any
weights are read, then the weights, with a spinner on a terminal."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from fastdllm.checkpoints.locate import resolve_model_dir

from fastdllm.errors import UserError

from .options import MODEL_DEFAULTS, RunOptions, forced
from .terminal import err_console, keys_not_echoed


def load_model(model_dir: Path, *, name: str | None = None, force: bool | None = None, canvas_tokens: int = 384,
               ranks=None, **placement: str):
    """Load with a spinner on a terminal (stderr), once the fit verdict allows it (--force skips it).
    The spinner is up before torch and transformers are imported (by the verdict's config classes
    or by loading): on 2 cores they take 2-5 s, most of a small model's start, which would
    otherwise pass with nothing on screen. The spinner is transient: a refusal is printed after it.
    `ranks`: tensor parallel (models/tensor_parallel.Ranks), this rank's share only; the fit verdict,
    which judges the whole model on one device, is not asked."""
    from fastdllm.checkpoints.placement import bf16_load_note

    # a Live that draws its first frame on entering (rich's console.status leaves it to its refresh
    # thread's first tick, which torch's import, holding the interpreter, delays by seconds)
    spinner = Live(Spinner("dots", Text(f"loading {model_dir.name} ..."), style="status.spinner"), console=err_console,
                   transient=True, refresh_per_second=12.5) if err_console.is_terminal else nullcontext()
    with spinner, keys_not_echoed():
        if ranks is not None:
            from fastdllm.checkpoints import tensor_parallel

            lm = tensor_parallel.load(model_dir, ranks, dtype=placement["dtype"], device=placement["device"])
        elif not forced(force):
            from fastdllm.checkpoints.fit import check

            if refused := check(model_dir, name or model_dir.name, canvas_tokens=canvas_tokens,
                                **{k: placement.get(k, MODEL_DEFAULTS[k]) for k in MODEL_DEFAULTS}):
                raise UserError(refused)
        if ranks is None:
            from fastdllm.checkpoints import loading

            lm = loading.load(model_dir, **placement)
    if slow := bf16_load_note(lm):
        err_console.print(f"note: {slow}", style="yellow")
    for note in lm.notes:
        err_console.print(f"note: {note}", style="yellow")
    return lm


PROMPT_ALLOWANCE = 128     # the fit verdict's canvas: the answer's tokens plus a prompt of this many


def catalog_profile(spec: str | None) -> str | None:
    """A catalog name's profile (its authors' settings: TraDo's, Dream-Coder's), else None."""
    from fastdllm.checkpoints import catalog

    entry = catalog.lookup(spec) if spec else None
    return entry.profile if entry else None


def prepare(opts: RunOptions, ranks=None):
    """Resolve model dir, profile and config (before any weights are read), then load the model
    (`ranks`: this tensor-parallel rank's share of it)."""
    from fastdllm.decode import profiles

    model_dir = resolve_model_dir(opts.model)
    profile = profiles.find(opts.profile or catalog_profile(opts.model) or profiles.default_profile_for(model_dir))
    cfg = profiles.resolve(profile, opts.decode, model_dir)
    named = opts.model if opts.model and not Path(opts.model).expanduser().exists() else None   # dream:7b
    lm = load_model(model_dir, name=named, force=opts.force, canvas_tokens=PROMPT_ALLOWANCE + cfg.gen_len,
                    dtype=opts.dtype, device=opts.device, quantize=opts.quantize, device_map=opts.device_map,
                    max_memory=opts.max_memory, ranks=ranks)
    trained = lm.model.attention.block
    if trained is not None and cfg.block_len != trained:
        err_console.print(f"note: blocks of {cfg.block_len}, but {model_dir.name} was trained with blocks of "
                          f"{trained}: not its authors' setting", style="yellow")
    return lm, profile, cfg
