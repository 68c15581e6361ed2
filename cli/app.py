"""The `fastdllm` command. Heavy imports (torch, transformers) happen inside commands, so --help is fast."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.text import Text

from fastdllm import host_memory, threads
from fastdllm.errors import UserError

from . import user_errors
from .analyze import analyze
from .bench import bench
from .chat import chat
from .eval import EXAMPLES as EVAL_EXAMPLES
from .eval import eval_
from .generate import generate
from .info import info
from .models_cmd import list_, ps, pull, recommend, rm, show
from .profiles_cmd import app as profiles_app
from .serve import EXAMPLES as SERVE_EXAMPLES
from .serve import serve
from .terminal import err_console

app = typer.Typer(
    name="fastdllm", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Fast local decoding for diffusion language models (LLaDA, Dream): block-wise KV cache "
         "and confidence-aware parallel decoding (Fast-dLLM). CPU threads: FASTDLLM_THREADS or OMP_NUM_THREADS "
         "(default: the physical cores this process may use, fewer while other processes keep some busy).")


@app.callback()
def main_options(debug: Annotated[bool, typer.Option("--debug", help="Show Python tracebacks.")] = False):
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


def main() -> None:
    try:
        app()
    except SystemExit as e:                     # a rank of a parallel run leaves with the others
        from fastdllm.eval.distributed import finish

        finish(e.code)
        raise
