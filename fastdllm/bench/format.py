"""Render bench records (the flat dicts of `fastdllm.bench`): a rich table and Markdown for people,
JSON / JSONL / CSV for machines, and a plot. Every format reads the same records; the human ones
move the values shared by all rows (model, device, gen_len when not swept, ...) into a caption."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ..decode.rules import RULES, rule_text
from ..errors import UsageError, UserError
from ..units import human_bytes, plural
from .cases import SPREAD_LIMIT
from .plot_labels import place_labels

FORMATS = ("table", "md", "json", "jsonl", "csv", "html")
SUFFIXES = {".md": "md", ".json": "json", ".jsonl": "jsonl", ".csv": "csv", ".txt": "table", ".html": "html"}


def format_for(name: str | None, path: Path | None) -> str:
    """The format asked for with --format, else the output file's suffix, else the table."""
    if name is not None:
        if name not in FORMATS:
            raise UsageError(f"--format {name}: expected one of {', '.join(FORMATS)}")
        return name
    if path is None:
        return "table"
    if path.suffix.lower() not in SUFFIXES:
        raise UsageError(f"cannot tell the format of {path} from its suffix: pass --format {'|'.join(FORMATS)}")
    return SUFFIXES[path.suffix.lower()]


def tunable(r: dict) -> bool:
    """A record whose rule has a confidence parameter (worth labelling in plots)."""
    return RULES[r["rule"]].needs_probability


def _pct(x) -> str:
    return f"{100 * x:.1f}%"


def _spread(r: dict) -> str | None:
    spread = r.get("tokens_per_second_spread")
    return None if spread is None else _pct(spread)


def _speedup(r: dict) -> str | None:
    """'3.21x'; '~3.21x' when the spreads make it unreliable (see runner.SPREAD_LIMIT)."""
    if r["speedup"] is None:
        return None
    return ("~" if r.get("speedup_reliable") is False else "") + f"{r['speedup']:.2f}x"


def _unquantized(r: dict) -> str | None:
    same = r.get("agreement_unquantized_tokens")
    return None if same is None else _pct(same)


# (header, value from a record, shown only when the values differ between rows)
COLUMNS = [
    ("config", lambda r: r["config"], False),
    ("cache", lambda r: r["cache"], False),
    ("rule", rule_text, False),
    ("gen", lambda r: str(r["gen_len"]), True),
    ("block", lambda r: str(r["block_len"]), True),
    ("batch", lambda r: str(r["batch_size"]), True),
    ("tok/s", lambda r: f"{r['tokens_per_second']:.1f}", False),
    ("spread", _spread, False),
    ("speedup", _speedup, False),
    ("NFE", lambda r: str(r["nfe"]), False),
    ("edits/block", lambda r: None if r.get("edits_per_block") is None else f"{r['edits_per_block']:.1f}", False),
    ("tok/fwd", lambda r: f"{r['tokens_per_forward']:.2f}", False),
    ("commit/fwd", lambda r: None if r.get("committed_per_forward") is None else f"{r['committed_per_forward']:.2f}", False),
    ("answer", lambda r: None if r.get("answer_tokens") is None else f"{r['answer_tokens']:.1f}", False),
    ("pos/fwd", lambda r: None if not r.get("positions_per_forward") else f"{r['positions_per_forward']:.0f}", False),
    ("complete", lambda r: None if r.get("constraint_complete") is None else "{}/{}".format(*r["constraint_complete"]), False),
    ("matcher ms/step", lambda r: None if r.get("matcher_ms_per_step") is None else f"{r['matcher_ms_per_step']:.2f}", False),
    ("same tok", lambda r: None if r["agreement_tokens"] is None else _pct(r["agreement_tokens"]), False),
    ("same ans", lambda r: None if r["agreement_answers"] is None else _pct(r["agreement_answers"]), False),
    ("same tok unquant.", _unquantized, False),
    ("quality", lambda r: None if r["quality"] is None else _pct(r["quality"]), False),
    ("peak mem", lambda r: human_bytes(r["peak_memory_bytes"]), False),
    ("KV cache", lambda r: human_bytes(r["cache_bytes"]), False),
]
LEFT = {"config", "cache", "rule"}          # text columns; numbers are right-aligned


def cells(records: list[dict]) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows of strings, caption) for the human formats. Columns that are empty for every
    row are dropped; sweep columns are shown only when they vary (else they go to the caption)."""
    kept = []
    for header, get, only_if_varies in COLUMNS:
        values = [get(r) for r in records]
        if all(v is None for v in values) or (only_if_varies and len(set(values)) == 1):
            continue
        if header == "quality" and records[0].get("quality_metric"):
            header = records[0]["quality_metric"]
        kept.append((header, ["" if v is None else v for v in values]))
    headers = [h for h, _ in kept]
    rows = [list(row) for row in zip(*(values for _, values in kept))]
    return headers, rows, caption(records)


def caption(records: list[dict]) -> str:
    r = records[0]
    parts = [f"{r['model_name']} ({r['family']}, {r['device']}, {r['dtype']}"
             + (f", {r['quantize']}" if r.get("quantize") not in (None, "none") else "") + ")",
             plural(r["n_prompts"], f"{r['prompt_set']} prompt") + (", infilling" if r.get("infill") and r["prompt_set"] != "infill" else "" if r["chat_template"] else ", raw")]
    for key, name in (("gen_len", "gen_len"), ("block_len", "block_len"), ("batch_size", "batch")):
        if len({x[key] for x in records}) == 1:
            parts.append(f"{name} {r[key]}")
    low, high = min(x["repetitions"] for x in records), max(x["repetitions"] for x in records)
    counts = f"{low}" if low == high else f"{low}-{high}"
    parts.append(f"{counts} timed repetition{'s' * (high > 1)}" + (" (auto)" if r.get("repetitions_asked") == "auto" else "")
                 + (" interleaved, tok/s their median, spread (fastest - slowest) / median"
                    + (" of the repetitions it keeps (of 3 or more, the one farthest from it left out)" if high > 2 else "")
                    if high > 1 else "")
                 + f", {r['warmup']} warm-up")
    if any(x.get("committed_per_forward") is not None for x in records):     # records of this version
        parts.append("tok/fwd: answer tokens (up to the end token) per forward; commit/fwd: positions committed "
                     "per forward, end padding included")
    if any(x.get("positions_per_forward") for x in records):
        parts.append("answer: tokens per answer, up to its end token; pos/fwd: canvas positions a forward runs (no cache: "
                     "the whole canvas, prompt included; prefix: the block and all after it; dual: the block; every "
                     "block's first step: the whole canvas); a row outruns the baseline where it runs fewer positions "
                     "per answer token (pos/fwd / tok/fwd)"
                     + ("; a FOCUS row: the mean over the layers of the positions each layer computes (layers 0 "
                        "and 1: the block's uncached positions; the later layers: the kept ones), so a dropped "
                        "token counts as saved in the share of layers that skip it"
                        if any(x.get("focus_alpha") is not None for x in records) else ""))
    if short := _short_answers(records):
        parts.append(short)
    if any(x.get("speedup_reliable") is False for x in records):
        parts.append(f"~: speed-up unreliable (a spread above {SPREAD_LIMIT:.0%}, or the row's and its "
                     "baseline's ranges overlap; of 3 or more repetitions, the one farthest from the median left out)")
    if any(x.get("agreement_unquantized_tokens") is not None for x in records):
        parts.append("same tok unquant.: tokens equal to the same row on unquantized weights")
    if r.get("tensor_parallel"):
        parts.append(f"one model split over {r['tensor_parallel']} tensor-parallel processes (rank 0's seconds and memory)")
    if r.get("processes", 1) > 1:
        parts.append(f"{r['processes']} processes (tok/s over the slowest one's seconds)")
    parts.append(f"torch {r['torch']}, transformers {r['transformers']}, fastdllm {r['fastdllm']}")
    parts.append(f"peak memory = {r['peak_memory_kind']}")
    return " · ".join(parts)


def _short_answers(records: list[dict]) -> str | None:
    """A footer line where early stop ends every answer inside the first block of a long canvas:
    then the canvas after the answer is never decoded, and PrefixCache has only the prompt to reuse."""
    long = [x for x in records if x.get("early_stop", True) and x["gen_len"] >= 4 * x["block_len"]
            and x.get("answer_tokens") is not None]
    if not long or max(x["answer_tokens"] for x in long) >= min(x["block_len"] for x in long):
        return None
    return (f"every answer ends inside the first block ({max(x['answer_tokens'] for x in long):.1f} tokens at most, "
            "mean per row): early stop ends decoding there, so each row's time is one block's steps (DualCache's gain: "
            "its steps compute the block, not the whole canvas) and PrefixCache, with only the prompt to reuse, is no "
            "faster than the baseline; --no-early-stop decodes the whole canvas as the paper times it")


def left_out_lines(left_out: list[str]) -> str:
    """The rows a suite left out, one line each under the caption (bench --suite)."""
    return "".join(f"\nleft out: {line}" for line in left_out)


def table(records: list[dict], left_out: list[str] = ()):
    from rich.table import Table

    headers, rows, text = cells(records)
    t = Table(caption=text + left_out_lines(left_out), caption_justify="left", header_style="bold")
    for h in headers:
        t.add_column(h, justify="left" if h in LEFT else "right", no_wrap=h in ("config", "tok/s"))
    for row in rows:
        t.add_row(*row)
    return t


def markdown(records: list[dict], left_out: list[str] = ()) -> str:
    headers, rows, text = cells(records)
    text += left_out_lines(left_out).replace("\n", "\n\n")
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if h in LEFT else "---:" for h in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + f"\n\n{text}\n"


def render(records: list[dict], fmt: str, width: int = 200, left_out: list[str] = ()) -> str:
    """Records as text in one of FORMATS (the table without colours, for files and pipes); the rows
    a suite left out under the table and in JSON (JSONL and CSV hold records only)."""
    if fmt == "json":
        return json.dumps({"records": records, **({"left_out": list(left_out)} if left_out else {})}, indent=2) + "\n"
    if fmt == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in records)
    if fmt == "csv":                          # flat: the per-rank figures stay in JSON
        flat = [{k: v for k, v in r.items() if k != "ranks"} for r in records]
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(flat[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(flat)
        return out.getvalue()
    if fmt == "md":
        return markdown(records, left_out)
    if fmt == "html":                         # format_html.py: the table and the speed/agreement scatter
        from .format_html import page

        return page(records, list(left_out), *cells(records))
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, color_system=None, highlight=False)
    console.print(table(records, left_out))
    return console.file.getvalue()


def series_name(r: dict, records: list[dict], with_rule: bool) -> str:
    """A row's name for a plot legend: the config plus whatever else varies between records."""
    name = r["config"]
    for key, tag in (("block_len", "block "), ("batch_size", "batch ")):
        if len({x[key] for x in records}) > 1:
            name += f", {tag}{r[key]}"
    return name + (f" {rule_text(r)}" if with_rule and tunable(r) else "")


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("--plot needs matplotlib, from the `plot` extra: pip install 'fastdllm[plot]'") from None


def plot(records: list[dict], path: Path) -> None:
    """Left: tokens/s against gen_len, one line per configuration. Right (when a baseline was run):
    speedup against token agreement with the baseline, each threshold / factor sweep as a line."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    compared = [r for r in records if r["speedup"] is not None and r["agreement_tokens"] is not None]
    fig, axes = plt.subplots(1, 2 if compared else 1, figsize=(12 if compared else 6.5, 4.5), squeeze=False)
    left = axes[0][0]
    for name, rows in _by(records, lambda r: series_name(r, records, with_rule=True)).items():
        rows.sort(key=lambda r: r["gen_len"])
        left.plot([r["gen_len"] for r in rows], [r["tokens_per_second"] for r in rows], marker="o", label=name)
    left.set(xlabel="generation length (tokens)", ylabel="tokens / s", title="throughput")
    left.set_xticks(sorted({r["gen_len"] for r in records}))
    left.legend(fontsize="small")
    if compared:
        right = axes[0][1]
        several = len({r["gen_len"] for r in compared}) > 1

        def sweep_of(r):     # the points of one threshold / factor sweep share everything else
            return series_name(r, compared, with_rule=False) + (f", gen {r['gen_len']}" if several else "")

        for name, rows in _by(compared, sweep_of).items():
            rows.sort(key=lambda r: r["agreement_tokens"])
            right.plot([r["agreement_tokens"] for r in rows], [r["speedup"] for r in rows], marker="o", label=name)
        right.margins(0.15)
        right.set(xlabel="token agreement with the baseline", ylabel="speedup over the baseline",
                  title="speed vs agreement")
        right.legend(fontsize="small")
    fig.suptitle(caption(records).split(" · torch")[0], fontsize="small")
    fig.set_dpi(120)                                 # the saved size: labels are placed in its pixels
    fig.tight_layout()
    if compared:
        place_labels(axes[0][1], [(rule_text(r), r["agreement_tokens"], r["speedup"]) for r in compared if tunable(r)])
    try:
        fig.savefig(path, dpi=120)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot write the plot {path}: {e}") from None
    finally:
        plt.close(fig)


def _by(records: list[dict], key) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(key(r), []).append(r)
    return groups
