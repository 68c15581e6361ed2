"""`fastdllm analyze`'s outputs from analyze.py's numbers: advice in words, the figures (PNG,
matplotlib from the `plot` extra, imported here only) and one self-contained HTML page."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from ..errors import UserError
from .plot_labels import place_labels
from ..units import plural

ONE_PERCENT = 0.01


def rule_label(cfg: dict) -> str:
    rule = cfg["rule"]
    return f"{rule} {cfg[rule]}" if rule in ("threshold", "factor") else rule


def advice(data: dict) -> list[str]:
    """Sentences computed from the numbers: drift, agreement, what the sweep would save."""
    lines = []
    for mode, d in data["drift"].items():
        if "refused" in d:
            lines.append(d["refused"])
            continue
        errors = d["mean_error_by_layer"]
        if not errors:
            continue
        under = next((i for i in range(len(errors)) if all(e < ONE_PERCENT for e in errors[i:])), None)
        worst = max(range(len(errors)), key=errors.__getitem__)
        where = (f"stays under 1% from layer {under} on" if under is not None
                 else f"is over 1% from layer {next(i for i, e in enumerate(errors) if e >= ONE_PERCENT)} on")
        lines.append(f"{mode} cache: K/V drift {where} (mean relative error {errors[worst]:.1%} at layer {worst}, "
                     f"worst {d['max_error_by_layer'][worst]:.1%}; lowest cosine {d['min_cosine']:.3f})")
        share = d["error_share"]
        if sum(share.values()) > 0:
            names = {"before": "the prompt and finished blocks", "block": "the active block",
                     "after": "the masked suffix"}
            top = max(share, key=share.get)
            lines.append(f"{mode} cache: {share[top]:.0%} of its K/V error sits in {names[top]}")
    agree = data["agreement"]
    label = rule_label(data["config"])
    lines.append(f"{label} agreed with the uncached one-token baseline on {agree['rate']:.0%} of "
                 f"{plural(agree['compared'], 'commit')} ({data['nfe']} NFE against the baseline's {data['baseline']['nfe']}, "
                 f"{data['tokens_per_forward']:.2f} answer tokens per forward, {data['committed_per_forward']:.2f} "
                 "positions committed)")
    confident = [c for s in data["steps"] for c in s["commits"] if c["agrees"] is not None and c["confidence"] >= 0.9]
    if confident:
        rate = sum(c["agrees"] for c in confident) / len(confident)
        lines.append(f"commits at confidence >= 0.9 agreed on {rate:.0%} ({plural(len(confident), 'commit')})")
    cfg = data["config"]
    for run in data["sweep"]:
        if run["rule"] == "cache":
            if run["value"] == cfg["cache"]:
                continue
            what = f"the same rule with cache {run['value']}"
        elif (run["rule"], run["value"]) == (cfg["rule"], cfg.get(run["rule"])):
            continue
        else:
            what = f"{run['rule']} {run['value']}"
        saving = 1 - run["nfe"] / max(data["nfe"], 1)
        verb = "would save" if saving >= 0 else "would cost"
        lines.append(f"{what} {verb} {abs(saving):.0%} NFE at {run['agreement']:.0%} agreement")
    uncached = next((r for r in data["sweep"] if (r["rule"], r["value"]) == ("cache", "none")), None)
    if uncached and cfg["cache"] != "none" and uncached["agreement"] - agree["rate"] >= 0.1:
        lines.append(f"the disagreement comes from the cache, not the rule: without a cache {label} "
                     f"agrees on {uncached['agreement']:.0%}")
    return lines


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("analyze draws with matplotlib: pip install 'fastdllm[plot]'") from None
    return plt


def figures(data: dict) -> dict[str, bytes]:
    """name -> PNG bytes: timeline, confidence, one drift heatmap per measured cache, sweep."""
    plt = _pyplot()
    out = {}

    def save(name, fig):
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")   # the figure's own dpi: labels measured as saved
        plt.close(fig)
        out[name] = buffer.getvalue()

    # timeline: each committed position at the NFE that committed it (the live view, frozen)
    fig, (raster, bars) = plt.subplots(1, 2, figsize=(10, 3.2), gridspec_kw={"width_ratios": [3, 1]})
    xs = [c["position"] for s in data["steps"] for c in s["commits"]]
    ys = [s["nfe"] for s in data["steps"] for _ in s["commits"]]
    raster.scatter(xs, ys, s=6, marker="s", c="tab:blue")
    raster.set(xlabel="generated position", ylabel="NFE (step)", title="which position was committed when")
    raster.invert_yaxis()
    blocks = data["blocks"]
    bars.bar([b["block"] for b in blocks], [b["nfe"] for b in blocks], color="tab:gray")
    bars.set(xlabel="block", ylabel="NFE", title=f"{data['tokens_per_forward']:.2f} answer tok/forward",
             xticks=[b["block"] for b in blocks])
    integer_ticks(raster, "x", "y")
    save("timeline", fig)

    # confidence against the baseline, by rank in the step, with both rules' boundaries
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    commits = [c for s in data["steps"] for c in s["commits"] if c["agrees"] is not None]
    for agrees, colour, label in ((True, "tab:green", "agrees with baseline"), (False, "tab:red", "differs")):
        chosen = [c for c in commits if c["agrees"] is agrees]
        ax.scatter([c["rank"] for c in chosen], [c["confidence"] for c in chosen], s=12, c=colour, label=label, alpha=0.7)
    top = max([c["rank"] for c in commits] + [4])
    ranks = list(range(1, top + 1))
    cfg = data["config"]
    ax.axhline(cfg["threshold"], ls="--", c="k", lw=1, label=f"threshold {cfg['threshold']}")
    ax.plot(ranks, [1 - cfg["factor"] / (n + 1) for n in ranks], ls=":", c="tab:purple",
            label=f"factor {cfg['factor']}: c > 1 - f/(n+1)")
    ax.set(xlabel="rank n in its step (1 = most confident)", ylabel="confidence", ylim=(0, 1.02),
           title="committed tokens: confidence vs agreement")
    ax.legend(fontsize=7, loc="lower left")
    integer_ticks(ax, "x")                           # ranks are whole numbers
    save("confidence", fig)

    for mode, d in data["drift"].items():
        if "refused" in d or not d["steps"]:
            continue
        # heatmap (layers, steps): the larger of K's and V's relative error, refresh steps = 0
        grid = [[max(k, v) for k, v in zip(s["k_err"], s["v_err"])] for s in d["steps"]]
        fig, ax = plt.subplots(figsize=(8, 2.8))
        image = ax.imshow(list(map(list, zip(*grid))), aspect="auto", cmap="magma", origin="lower", interpolation="nearest")
        edges = [i for i, s in enumerate(d["steps"]) if s["refresh"] and i]
        for x in edges:
            ax.axvline(x - 0.5, c="w", lw=0.6)
        ax.set(xlabel="step (white lines: block starts, a full refresh)", ylabel="layer",
               title=f"{mode} cache: relative error of cached K/V against a fresh forward")
        integer_ticks(ax, "x", "y")
        fig.colorbar(image, ax=ax)
        save(f"drift-{mode}", fig)

    save("sweep", sweep_figure(plt, data["sweep"]))
    return out


def sweep_figure(plt, sweep: list[dict]):
    """NFE against agreement for each what-if run, every point labelled where it can be read."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for run in sweep:
        ax.scatter(run["nfe"], run["agreement"], c={"factor": "tab:orange", "cache": "tab:green"}.get(run["rule"], "tab:blue"))
    ax.set(xlabel="NFE", ylabel="agreement with baseline", title="what-if: other rules (same cache), other caches (same rule)")
    ax.margins(0.2)
    integer_ticks(ax, "x")
    fig.tight_layout()
    place_labels(ax, [(f"{run['rule']} {run['value']}", run["nfe"], run["agreement"]) for run in sweep])
    return fig


def integer_ticks(ax, *axes: str) -> None:
    """Ticks on whole numbers only (positions, steps, ranks, layers)."""
    from matplotlib.ticker import MaxNLocator

    for name in axes:
        getattr(ax, f"{name}axis").set_major_locator(MaxNLocator(integer=True))


def write_report(data: dict, html_path: Path) -> list[Path]:
    """The HTML page at html_path (PNGs embedded as base64) and the PNGs beside it; returns the files."""
    pngs = figures(data)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    written = [html_path]
    for name, png in pngs.items():
        path = html_path.with_name(f"{html_path.stem}-{name}.png")
        path.write_bytes(png)
        written.append(path)
    items = "".join(f"<li>{html.escape(line)}</li>" for line in data["advice"])
    images = "".join(f'<h2>{name}</h2><img alt="{name}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
                     for name, png in pngs.items())
    head = f"{data.get('model', 'model')} · profile {data.get('profile', '?')} · cache {data['config']['cache']} · " \
           f"{rule_label(data['config'])}"
    page = (f"<!doctype html><meta charset='utf-8'><title>fastdllm analyze</title>"
            f"<style>body{{font-family:sans-serif;max-width:900px;margin:auto}}img{{max-width:100%}}</style>"
            f"<h1>fastdllm analyze</h1><p>{html.escape(head)}</p><h2>advice</h2><ul>{items}</ul>"
            f"<h2>answer</h2><pre>{html.escape(data['text'])}</pre>{images}"
            f"<details><summary>numbers (JSON)</summary><pre>{html.escape(json.dumps(summary(data), indent=1))}</pre></details>")
    html_path.write_text(page)
    return written


def summary(data: dict) -> dict:
    """The headline numbers, without per-step lists (for the page)."""
    keep = ("nfe", "committed", "tokens_per_forward", "committed_per_forward", "prompt_tokens", "generated_tokens",
            "agreement", "sweep", "seconds")
    drift = {m: d if "refused" in d else {k: v for k, v in d.items() if k != "steps"} for m, d in data["drift"].items()}
    return {**{k: data[k] for k in keep}, "drift": drift, "baseline_nfe": data["baseline"]["nfe"]}
