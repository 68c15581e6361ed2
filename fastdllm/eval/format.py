"""Render `fastdllm eval` records: a table or Markdown for people (what every row shares in a
caption), JSON or CSV for machines (every field, the decoding config included)."""

from __future__ import annotations

import csv
import io
import json

from ..decode.rules import rule_fields, rule_text

FORMATS = ("table", "md", "json", "csv")
SUFFIXES = {".md": "md", ".json": "json", ".csv": "csv", ".txt": "table"}
HEADER = ["task", "profile", "cache", "rule", "metric", "value", "± stderr", "change", "tok/s", "speed",
          "NFE/answer", "tok/fwd", "answers", "seconds"]


def cells(r: dict) -> list[str]:
    cfg = r["config"]
    change = r["change"] or {}
    return [
        r["task"], r["profile"], cfg["cache"], rule_text(rule_fields(_cfg(cfg))), r["metric"],
        f"{r['value']:.4f}", "-" if r["stderr"] is None else f"{r['stderr']:.4f}",
        "" if not change else f"{change['value']:+.4f}",
        "-" if r["tokens_per_second"] is None else f"{r['tokens_per_second']:.1f}",
        "" if not change or change["speed"] is None else f"{change['speed']:.2f}x",
        "-" if r["nfe_per_answer"] is None else f"{r['nfe_per_answer']:.1f}",
        "-" if r["tokens_per_forward"] is None else f"{r['tokens_per_forward']:.2f}",
        str(r["answers"]), f"{r['seconds']:.1f}",
    ]


def _cfg(values: dict):
    from ..decode.config import DecodeConfig

    return DecodeConfig.from_dict(values)


def caption(records: list[dict]) -> str:
    r = records[0]
    shots = "task default" if r["num_fewshot"] is None else r["num_fewshot"]
    return (f"{r['model']} ({r['family']}, {r['device']}, {r['dtype']}"
            + (f", {r['quantize']}" if r.get("quantize") not in (None, "none") else "") + f") on {r['machine']} · "
            f"few-shot {shots} · limit {r['limit'] or 'none'} · chat template {'on' if r['chat'] else 'off'} · "
            f"torch {r['torch']}" + (f", CUDA {r['cuda']}" if r["cuda"] else "") + f", lm-eval {r['lm_eval']}, "
            f"fastdllm {r['fastdllm']}" + (f" · {r['processes']} processes" if r.get("processes", 1) > 1 else "")
            + " · tok/s: answer tokens (up to the end token) per second of decoding; tok/fwd: answer tokens per forward"
            + (" (the slowest process's)" if r.get("processes", 1) > 1 else "")
            + "; change and speed (the speed-up: tok/s over the reference's) against the task's first row"
            + (" at the same gen_len (ROW@LEN)" if r.get("gen_len") else ""))


def table(records: list[dict]):
    from rich.table import Table

    t = Table(caption=caption(records), caption_justify="left")
    for name in HEADER:
        t.add_column(name, justify="left" if name in ("task", "profile", "cache", "rule", "metric") else "right")
    for r in records:
        t.add_row(*cells(r))
    return t


def render(records: list[dict], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(records, indent=2) + "\n"
    if fmt == "csv":
        flat = [{**{k: v for k, v in r.items() if k not in ("metrics", "config", "change", "ranks")},
                 "change_value": (r["change"] or {}).get("value"), "change_speed": (r["change"] or {}).get("speed"),
                 **{f"config_{k}": v for k, v in r["config"].items()}} for r in records]
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(flat[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(flat)
        return out.getvalue()
    rows = [cells(r) for r in records]
    if fmt == "md":
        lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + f"\n\n{caption(records)}\n"
    widths = [max(len(x) for x in col) for col in zip(HEADER, *rows)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [HEADER, *rows]]
    return "\n".join(lines) + f"\n{caption(records)}\n"
