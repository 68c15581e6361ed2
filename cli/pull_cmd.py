"""`fastdllm pull`: download a model into the Hugging Face cache, with its progress on stderr
(PullView: a bar on a terminal, a line per file in a pipe). No torch."""

from __future__ import annotations

from typing import Annotated

import typer

from .terminal import err_console, out_console
from .user_errors import user_errors


@user_errors
def pull(
    name: Annotated[str, typer.Argument(help="Catalog name (dream:7b) or hub id (ORG/NAME); of a GGUF repository, "
                                                 "with the quant tag of its one file (ORG/X-GGUF:Q4_K_M).")],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
):
    """Download a model into the Hugging Face cache: weights, configs and tokenizer files only
    (never a checkpoint's Python), each checked against the hash the hub lists; a stopped pull, run
    again, fetches only the rest."""
    from fastdllm.checkpoints.pull import pull as pull_model
    from fastdllm.units import human_bytes, plural

    with PullView(quiet) as view:
        done = pull_model(name, report=view)
    if done.skipped_code:
        err_console.print(f"note: not fetched (code is never run): {', '.join(done.skipped_code)}", style="yellow")
    here = len(done.files) - len(done.fetched)
    err_console.print(f"pulled {done.name}: {plural(len(done.files), 'file')}, {human_bytes(done.bytes)}, each checked "
                      "against the hash the hub lists" + (f" ({here} already here)" if here else ""))
    out_console.print(str(done.path))


class PullView:
    """pull's progress on stderr (checkpoints.fetch.Report): a bar with bytes and rate on a terminal,
    a line per file fetched in a pipe, neither with -q; a line per retry in every case."""

    def __init__(self, quiet: bool):
        self.quiet, self.bar = quiet, None
        if not quiet and err_console.is_terminal:
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                                TransferSpeedColumn(), TimeRemainingColumn(), console=err_console)
            self.task = self.bar.add_task("checking", total=None)

    def __enter__(self) -> "PullView":
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def fetching(self, name: str, size: int) -> None:
        from fastdllm.units import human_bytes

        if self.bar is not None:
            self.bar.update(self.task, description=name)
        elif not self.quiet:
            err_console.print(f"fetching {name} ({human_bytes(size)})")

    def progress(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done, total=total)

    def retry(self, line: str) -> None:
        (self.bar.console if self.bar is not None else err_console).print(line, style="yellow")
