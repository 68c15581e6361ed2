"""`fastdllm generate`: one prompt, the live unmasking view (or block-by-block streaming), stats."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Optional

import typer

from fastdllm.errors import UsageError

from . import parallel
from .constraint_flags import CONSTRAINT_FLAGS, compile_for, finish_note, spec_from
from .model import prepare
from .options import TENSOR_PARALLEL, RunOptions, generation_options
from .terminal import err_console, is_terminal, keys_not_echoed, live_view
from .text_input import read_prompt
from .user_errors import user_errors


@user_errors
@generation_options
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; '-' or a pipe reads stdin.")] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Read the prompt from a file.")] = None,
    chat: Annotated[Optional[bool], typer.Option("--chat/--raw", help="Apply the chat template (default: if the model has one).")] = None,
    think: Annotated[Optional[bool], typer.Option("--think/--no-think", help="The chat template's thinking mode, where it has one (Gemma-4: enable_thinking; default: the template's, off).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No stats line.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Detailed timing and memory stats.")] = False,
    no_live: Annotated[bool, typer.Option("--no-live", help="No live view, even on a terminal.")] = False,
    suffix: Annotated[Optional[str], typer.Option("--suffix", help="Infilling: text after the answer; the answer (-n tokens) is decoded between PROMPT and it.", rich_help_panel="Infilling")] = None,
    suffix_file: Annotated[Optional[Path], typer.Option("--suffix-file", help="Infilling: read the suffix from a file.", rich_help_panel="Infilling")] = None,
    infill_file: Annotated[Optional[Path], typer.Option("--infill", help="Infilling: a template file ('-': stdin) with holes <|mask:N|> (N tokens) or <|mask|> (-n tokens); prints the completed text.", rich_help_panel="Infilling")] = None,
    trim: Annotated[bool, typer.Option("--infill-trim/--no-infill-trim", help="Cut each hole at its first end-of-text token (the padding of a hole longer than its fill).", rich_help_panel="Infilling")] = True,
    json_schema: Annotated[Optional[Path], CONSTRAINT_FLAGS["json_schema"][1]] = None,
    regex: Annotated[Optional[str], CONSTRAINT_FLAGS["regex"][1]] = None,
    grammar: Annotated[Optional[Path], CONSTRAINT_FLAGS["grammar"][1]] = None,
    tp: Annotated[Optional[int], TENSOR_PARALLEL] = None,
    *, opts: RunOptions,
):
    """Generate an answer to PROMPT, showing block-by-block unmasking; or fill holes (--suffix, --infill)."""
    from fastdllm.decode.rules import describe

    live = not (json_out or no_live) and is_terminal(sys.stdout) and err_console.is_terminal
    spec = spec_from(json_schema, regex, grammar)
    infilling = infill_file is not None or suffix is not None or suffix_file is not None
    world, ranks = parallel.split_run(tp, opts, "infilling (--suffix, --infill) is not split over ranks yet"
                                      if infilling else None)
    if infilling:
        if spec is not None:
            raise UsageError("structured output: not combined with infilling (the text after a hole is not part "
                             "of the sentence; docs/specs/structured-output.md)")
        from .infill import infill

        return infill(opts, prompt, file, suffix, suffix_file, infill_file, chat=chat, trim=trim, json_out=json_out,
                      live=live, quiet=quiet, verbose=verbose)
    text = read_prompt(prompt, file) if world is None or world.first else ""   # tensor parallel: rank 0's
    lm, profile, cfg = prepare(opts, ranks)       # torch comes in here, under the loading spinner
    from fastdllm.decode.engine import run
    from fastdllm.terminal.stats import stats_block, stats_line
    from fastdllm.terminal.view import BlockStreamer

    ids = lm.encode(text, chat=chat, thinking=think) if text or world is None else []
    constraint = compile_for(spec, lm)
    if world is not None:                          # every rank decodes rank 0's prompt; rank 0 alone prints
        ids = world.all_gather(ids)[0]
        if not world.first:
            run(lm.decoder, [ids], cfg, constraints=[constraint] if constraint else None)
            return
    header = f"{lm.path.name} · profile {profile.name} · cache {cfg.cache} · {describe(cfg)}" + \
        (f" · {spec.label}" if spec else "")
    view = live_view(lm, ids, cfg, header, constrained=spec is not None) if live else None
    streamer = None if (json_out or live) else BlockStreamer(sys.stdout, lm.tokenizer, lm.specials.stops)
    sink = view or streamer                        # None with --json: only the result is printed
    with view or nullcontext(), keys_not_echoed():
        result = run(lm.decoder, [ids], cfg, on_event=sink.update if sink else None,
                     constraints=[constraint] if constraint else None)
    note = finish_note(result)                     # a constrained answer the length cut
    if json_out:
        if note:
            err_console.print(note, style="yellow")
        record = dict(result.to_dict(), profile=profile.name, model=lm.info)
        record["timings"] = {"load_s": lm.info["load_seconds"], **record["timings"]}
        sys.stdout.write(json.dumps(record) + "\n")
        return
    if streamer:
        streamer.finish(result)
    else:
        sys.stdout.write(result.texts[0] + "\n")
        sys.stdout.flush()
    if note:
        err_console.print(note, style="yellow")
    if verbose:
        err_console.print(stats_block(result, lm.info, view.overhead if view else None), style="dim")
    elif not quiet:
        err_console.print(stats_line(result), style="dim")
