"""`fastdllm analyze`: one instrumented run (bench/analyze.py), written as an HTML report with
pictures, a JSON of the numbers and advice in words (bench/analyze_report.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .model import prepare
from .options import RunOptions, generation_options
from .terminal import err_console
from .text_input import read_prompt
from .user_errors import user_errors


def set_prompt(name: str) -> str:
    """The first prompt of a built-in prompt set (analyze reads one prompt; infilling is not analyzed)."""
    from fastdllm.bench import prompts
    from fastdllm.errors import UsageError

    if name == "infill":
        raise UsageError("analyze decodes one answer after a prompt; the infill set fills holes (use code, math or chat)")
    return prompts.builtin(name).prompts[0]


@user_errors
@generation_options
def analyze(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; '-' or a pipe reads stdin.")] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Read the prompt from a file.")] = None,
    prompt_set: Annotated[Optional[str], typer.Option("--prompt-set", help="Analyze a built-in set's first prompt: code | math | chat.")] = None,
    chat: Annotated[Optional[bool], typer.Option("--chat/--raw", help="Apply the chat template (default: if the model has one).")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML report; its PNGs and JSON are written beside it.")] = Path("analyze.html"),
    old_output: Annotated[Optional[Path], typer.Option("-O", hidden=True, help="-o before 0.2.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object (the numbers) on stdout; no HTML.")] = False,
    *, opts: RunOptions,
):
    """Run PROMPT once with instrumentation: KV drift (prefix, dual), confidence against the uncached
    one-token baseline, the commit timeline, a what-if sweep; an HTML report and advice in words."""
    if old_output is not None:                         # every command's file is -o/--output (cli/results.py)
        err_console.print(f"note: -O is -o now (-O goes in the next release): -o {old_output}", style="yellow")
        output = old_output

    text = set_prompt(prompt_set) if prompt_set is not None and prompt is None and file is None else read_prompt(prompt, file)
    if not json_out:
        from fastdllm.bench.analyze_report import _pyplot

        _pyplot()                                      # refuse before the model loads, not after the runs
    lm, profile, cfg = prepare(opts)              # torch comes in here, under the loading spinner
    from fastdllm.bench.analyze import analyze as measure
    from fastdllm.bench.analyze_report import advice, write_report

    ids = lm.encode(text, chat=chat)
    data = {"model": lm.path.name, "profile": profile.name, **measure(lm.decoder, [*ids], cfg)}
    data["advice"] = advice(data)
    if json_out:
        sys.stdout.write(json.dumps(data) + "\n")
        return
    written = write_report(data, output)
    numbers = output.with_suffix(".json")
    numbers.write_text(json.dumps(data))
    for line in data["advice"]:
        sys.stdout.write(line + "\n")
    err_console.print(f"wrote {', '.join(str(p) for p in [*written, numbers])}", style="dim")
