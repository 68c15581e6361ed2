"""The `fastdllm` command. Heavy imports (torch, transformers) happen inside commands, so --help is fast."""

from __future__ import annotations

# First, before anything can import torch: OpenMP reads its wait policy when torch loads it
# (fastdllm/threads.py says why passive). `python -m fastdllm` comes through here too.
from fastdllm import threads

threads.prepare_wait_policy()

import os
from typing import Annotated

import typer
from rich.text import Text

from fastdllm.errors import UserError

from . import user_errors
from .bench import bench
from .chat import chat
from .eval import EXAMPLES as EVAL_EXAMPLES
from .eval import eval_
from .generate import generate
from .info import info
from .profiles_cmd import app as profiles_app
from .serve import EXAMPLES as SERVE_EXAMPLES
from .serve import serve
from .terminal import err_console

app = typer.Typer(
    name="fastdllm", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Fast local decoding for diffusion language models (LLaDA, Dream): block-wise KV cache "
         "and confidence-aware parallel decoding (Fast-dLLM). CPU threads: FASTDLLM_THREADS or OMP_NUM_THREADS "
         "(default: the physical cores this process may use; idle threads wait passively).")


@app.callback()
def main_options(debug: Annotated[bool, typer.Option("--debug", help="Show Python tracebacks.")] = False):
    user_errors.DEBUG["on"] = debug or bool(os.environ.get("FASTDLLM_DEBUG"))
    try:                        # every command runs after this and imports torch inside it
        threads.configure()
    except UserError as e:
        err_console.print(Text("error: ", style="bold red") + Text(str(e)))
        raise typer.Exit(e.exit_code) from None


app.command()(generate)
app.command()(bench)
app.command()(chat)
app.command(name="eval", epilog=EVAL_EXAMPLES)(eval_)
app.command()(info)
app.command(epilog=SERVE_EXAMPLES)(serve)
app.add_typer(profiles_app, name="profiles")


def main() -> None:
    app()
