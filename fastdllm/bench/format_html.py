"""A bench's records as one self-contained HTML page (`fastdllm bench --format html`, or an output
file ending in .html): the caption, the table, the rows left out, and a speed-up against agreement
scatter with one point per row compared with its baseline (PNG embedded as base64; matplotlib
from the `plot` extra, else the page says so). The accelerators suite's summary
(docs/accelerators/bench.md 8)."""

from __future__ import annotations

import base64
import html
import io

from .plot_labels import place_labels


def scatter_points(records: list[dict]) -> list[tuple[str, float, float]]:
    """(label, token agreement, speed-up) of every record compared with a baseline, the baseline too."""
    several = len({r["gen_len"] for r in records}) > 1
    return [(r["config"] + (f", gen {r['gen_len']}" if several else ""), r["agreement_tokens"], r["speedup"])
            for r in records if r["speedup"] is not None and r["agreement_tokens"] is not None]


def scatter_png(points: list[tuple[str, float, float]], title: str) -> bytes | None:
    """The scatter as PNG bytes; None without matplotlib or without points."""
    try:
        import matplotlib
    except ImportError:
        return None
    if not points:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=110)
    try:
        for label, agreement, speedup in points:
            ax.scatter([agreement], [speedup])
        ax.axhline(1.0, color="grey", linewidth=0.5)
        ax.set(xlabel="token agreement with the baseline", ylabel="speed-up over the baseline (tokens/s)",
               title=title)
        ax.margins(0.2)
        fig.tight_layout()
        place_labels(ax, points)
        out = io.BytesIO()
        fig.savefig(out, format="png", dpi=110)
        return out.getvalue()
    finally:
        plt.close(fig)


def page(records: list[dict], left_out: list[str], headers: list[str], rows: list[list[str]], caption: str) -> str:
    points = scatter_points(records)
    png = scatter_png(points, "speed vs agreement, one point per row")
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    dropped = "".join(f"<li>{html.escape(line)}</li>" for line in left_out)
    picture = (f'<img alt="speed vs agreement" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
               if png else "<p>" + ("the scatter needs matplotlib: pip install 'fastdllm[plot]'" if points else
                                    "no row was compared with a baseline: no scatter") + "</p>")
    return ("<!doctype html><meta charset='utf-8'><title>fastdllm bench</title>"
            "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}img{max-width:100%}"
            "td,th{padding:2px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
            "table{border-collapse:collapse}tr:nth-child(even){background:#f4f4f4}</style>"
            f"<h1>fastdllm bench</h1><p>{html.escape(caption)}</p><table><tr>{head}</tr>{body}</table>"
            + (f"<h2>left out</h2><ul>{dropped}</ul>" if dropped else "")
            + f"<h2>speed vs agreement</h2>{picture}")
