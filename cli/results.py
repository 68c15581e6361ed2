"""Results files of bench and eval: refused before the first row runs if they could not be written,
and replaced whole (never half a file) each time a row finishes."""

from __future__ import annotations

import os
from pathlib import Path

from fastdllm.errors import UsageError


def output_and_format(output: Path | None, fmt: str | None, formats: tuple[str, ...]) -> tuple[Path | None, str | None]:
    """Every command's convention: -o/--output FILE, --format FORMAT (ollama, lm-eval's -o and curl
    name a file with -o). bench and eval took -o for the format until 0.1: for one more release a
    bare format name after -o (no such file here) still picks the format, with a note."""
    if output is not None and fmt is None and str(output) in formats and not output.exists():
        from .terminal import err_console

        err_console.print(f"note: -o {output} is read as --format {output} for this release only: -o/--output "
                          f"names the output file now (use --format {output})", style="yellow")
        return None, str(output)
    return output, fmt


def check_writable(path: Path | None, flag: str) -> None:
    """Refuse a results file that could not be written, before the first row runs."""
    if path is None:
        return
    folder = path.absolute().parent
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory")
    if not folder.is_dir():
        raise UsageError(f"{flag} {path}: the directory {folder} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {path}: not writable")


def save(records: list[dict], fmt: str, output: Path, render=None) -> None:
    """Replace `output` whole (through a temporary file beside it: never half a file); `render`
    (records, fmt) -> text, bench's by default."""
    from fastdllm.bench.format import render as bench_render
    from fastdllm.errors import UserError

    partial = output.with_name(f".{output.name}.partial")
    try:
        partial.write_text((render or bench_render)(records, fmt))
        os.replace(partial, output)
    except OSError as e:
        raise UserError(f"cannot write {output}: {e}") from None
