"""The `fastdllm` command. Heavy imports (torch, transformers) happen inside commands, so --help is fast."""

from __future__ import annotations

import inspect
import os
from typing import Annotated, Optional

import typer
from rich.text import Text

from fastdllm import host_memory, threads
from fastdllm.errors import UserError
from fastdllm.models.registry import names

from . import user_errors
from .analyze import analyze
from .bench import bench
from .chat import chat
from .eval import EXAMPLES as EVAL_EXAMPLES
from .eval import eval_
from .generate import generate
from .info import info
from .models_cmd import list_, ps, recommend, rm, show
from .profiles_cmd import app as profiles_app
from .pull_cmd import pull
from .serve import EXAMPLES as SERVE_EXAMPLES
from .serve import serve
from .terminal import err_console

# every family's names, from each family module's `NAMES` read without importing it (models/registry.py;
# tests/cli/test_help.py checks the catalog's families are all here)
FAMILIES = ", ".join(names())

app = typer.Typer(
    name="fastdllm", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help=f"Fast local decoding for diffusion language models ({FAMILIES}; `fastdllm recommend --all` lists "
         "their checkpoints): block-wise KV cache and confidence-aware parallel decoding (Fast-dLLM). CPU threads: "
         "FASTDLLM_THREADS or OMP_NUM_THREADS (default: the physical cores this process may use, fewer while "
         "other processes keep some busy).")


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("fastdllm")
    except PackageNotFoundError:            # a source tree run as `python -m fastdllm`, never installed
        return "unknown (not installed)"


def print_version(value: bool) -> None:
    if value:
        typer.echo(f"fastdllm {version()}")
        raise typer.Exit()


@app.callback()
def main_options(
    debug: Annotated[bool, typer.Option("--debug", help="Show Python tracebacks.")] = False,
    _version: Annotated[Optional[bool], typer.Option("--version", callback=print_version, is_eager=True,
                                                     help="Print fastdllm's version and exit.")] = None,
):
    user_errors.DEBUG["on"] = debug or bool(os.environ.get("FASTDLLM_DEBUG"))
    try:                        # every command runs after this and imports torch inside it
        threads.configure(watch=True)
        host_memory.keep_freed()
    except UserError as e:
        err_console.print(Text("error: ", style="bold red") + Text(str(e)))
        raise typer.Exit(e.exit_code) from None


app.command()(generate)
app.command()(bench)
app.command()(analyze)
app.command()(chat)
app.command(name="eval", epilog=EVAL_EXAMPLES)(eval_)
app.command()(info)
app.command(name="list")(list_)
app.command()(show)
app.command()(pull)
app.command()(rm)
app.command()(recommend)
app.command()(ps)
app.command(epilog=SERVE_EXAMPLES)(serve)
app.add_typer(profiles_app, name="profiles")


def one_line_paragraphs(typer_app: typer.Typer) -> None:
    """Typer's rich help keeps a docstring's line breaks, which fall mid-sentence at any terminal
    width but the source's: each command's help is given with each paragraph on one line."""
    for command in typer_app.registered_commands:
        doc = command.help or inspect.getdoc(command.callback) or ""
        command.help = "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n")) or None
    for group in typer_app.registered_groups:
        one_line_paragraphs(group.typer_instance)


def flags_without_a_type() -> None:
    """Typer (0.2x) shows `<bool>` beside every flag, which takes no value: show nothing there."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "fastdllm", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.fastdllm = True
    TyperOption.display_type_rich = display_type_rich


one_line_paragraphs(app)
flags_without_a_type()


def main() -> None:
    try:
        app()
    except SystemExit as e:                     # a rank of a parallel run leaves with the others
        from fastdllm.eval.distributed import finish

        finish(e.code)
        quick_exit()
        raise


def quick_exit() -> None:
    """Once torch and transformers are in, the interpreter's last garbage collections walk their
    millions of objects, which kept a process 1.1-2.2 s after its last line on 2 cores. Frozen
    (gc.freeze), those objects are left out of the collections and the exit takes ~0.1 s; the
    exit is otherwise Python's own (threads joined, atexit hooks, modules torn down, files flushed
    and closed), unlike os._exit, which would also skip the `finally` of whoever runs main() (a
    profiler writing its results). Only objects in reference cycles are left to the kernel, whose
    finalizers Python does not promise at exit anyway."""
    import gc

    gc.freeze()
