"""`fastdllm generate --suffix/--suffix-file/--infill`: fill a hole between a prompt and a suffix,
or the holes of a template (fastdllm/decode/infill.py). Raw text only; the answer is the filled text."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from pathlib import Path

from fastdllm.errors import UsageError

from .model import prepare
from .options import RunOptions
from .terminal import err_console, keys_not_echoed
from .text_input import argument_text, read_prompt, read_text


def infill(opts: RunOptions, prompt, file, suffix, suffix_file, template_file, *, chat: bool | None, trim: bool,
           **output) -> None:
    """The infilling form of `generate`. `-n` is the hole's length (of --suffix and of `<|mask|>`),
    any number of tokens; the config's gen_len is that rounded up to whole blocks (the blocks run
    over the holes' masks, at most as many as the config has)."""
    from dataclasses import replace

    if chat:
        raise UsageError("--chat: infilling works on raw text (the template is the whole canvas)")
    parts, form = template_parts(prompt, file, suffix, suffix_file, template_file)
    hole = opts.decode["gen_len"]
    lm, profile, cfg = prepare(replace(opts, decode={**opts.decode, "gen_len": None}))   # torch: under the spinner
    from fastdllm.decode.canvas import block_end

    hole = hole or cfg.gen_len
    cfg = replace(cfg, gen_len=block_end(hole, cfg.block_len))
    fill(lm, profile, cfg, parts, form, hole=hole, trim=trim, **output)


def template_parts(prompt: str | None, file: Path | None, suffix: str | None, suffix_file: Path | None,
                   template_file: Path | None) -> tuple[list, str]:
    """(infill.parse parts, "suffix" | "template") from the flags; usage errors for mixed forms."""
    from fastdllm.decode import infill

    if template_file is not None:
        if prompt is not None or file is not None or suffix is not None or suffix_file is not None:
            raise UsageError("--infill FILE holds the whole text: give no prompt, -f, --suffix or --suffix-file with it")
        return infill.parse(read_text(template_file, "--infill")), "template"
    if suffix is not None and suffix_file is not None:
        raise UsageError("give --suffix TEXT or --suffix-file FILE, not both")
    text = (argument_text(suffix, "--suffix") if suffix is not None else read_text(suffix_file, "--suffix-file"))
    if not text:
        raise UsageError("the suffix is empty: leave --suffix out to generate without one")
    return [read_prompt(prompt, file), None, text], "suffix"


def fill(lm, profile, cfg, parts: list, form: str, *, hole: int, trim: bool, json_out: bool, live: bool,
         quiet: bool, verbose: bool) -> None:
    from fastdllm.decode import infill
    from fastdllm.decode.engine import run
    from fastdllm.decode.rules import describe
    from fastdllm.terminal.stats import stats_block, stats_line
    from fastdllm.terminal.view import InfillCanvas

    filling = infill.for_model(lm, parts, hole)
    header = (f"{lm.path.name} · profile {profile.name} · cache {cfg.cache} · {describe(cfg)} · "
              f"{len(filling.holes)} hole{'s' * (len(filling.holes) > 1)}")
    view = InfillCanvas(err_console, lm.tokenizer, header, filling.ids, filling.holes, cfg.block_len,
                        lm.specials.stops) if live else None
    with view or nullcontext(), keys_not_echoed():
        result = run(lm.decoder, [filling.ids], cfg, on_event=view.update if view else None, holes=filling.holes)
    stops = set(lm.specials.stops)
    kept = [infill.cut(h, stops, trim) for h in result.holes[0]]
    texts = [lm.tokenizer.decode(ids, skip_special_tokens=trim) for ids in kept]
    if json_out:
        record = dict(result.to_dict(), profile=profile.name, model=lm.info, trim=trim)
        record["timings"] = {"load_s": lm.info["load_seconds"], **record["timings"]}
        if form == "suffix":
            record.update(text=texts[0], prefix=filling.texts[0], middle=texts[0], suffix=filling.texts[1])
        else:
            record["text"] = infill.completed(filling, texts)
        record["holes"] = [{"index": i, "length": e - s, "ids": ids, "text": text}
                           for i, ((s, e), ids, text) in enumerate(zip(filling.holes, kept, texts))]
        sys.stdout.write(json.dumps(record) + "\n")
        return
    out = texts[0] if form == "suffix" else infill.completed(filling, texts)
    sys.stdout.write(out if out.endswith("\n") else out + "\n")
    sys.stdout.flush()
    if verbose:
        err_console.print(stats_block(result, lm.info, view.overhead if view else None), style="dim")
    elif not quiet:
        err_console.print(stats_line(result), style="dim")

