"""`fastdllm analyze`'s numbers: one run of a model under a config, instrumented from the decoder's
own event stream (the stepper decode/engine.py picks; no second decode loop), plus the references
it is read against.

- timeline: per step the committed positions, their confidences and ranks; NFE per block, answer
  tokens per forward (and positions committed per forward);
- KV drift (bidirectional families, prefix and dual caches): after each step's forward, per layer,
  the cached K/V the step attended to against a fresh full forward of the same canvas (the canvas
  before the step's commit): cosine similarity and relative error;
- confidence vs correctness: each committed token against the uncached one-token-per-step
  baseline's token at that position;
- a what-if sweep: the same cache under other thresholds and factors, their NFE and agreement.

Everything is plain data (JSON-ready); analyze_report.py draws it and writes the advice.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from ..decode.cache_modes import CACHE_MODES
from ..decode.config import DecodeConfig
from ..decode.decoder import Decoder
from ..decode.engine import run, stepper
from ..decode.events import Result, StepEvent
from ..errors import UserError

DRIFT_MODES = ("prefix", "dual")
# what-if runs beside the analyzed one (kept few: each is a whole decode): (rule, value) is that
# rule with that parameter, ("cache", mode) the same rule under another cache mode
SWEEP = (("threshold", 0.7), ("threshold", 0.8), ("threshold", 0.9), ("factor", 1.0),
         ("cache", "none"), ("cache", "prefix"), ("cache", "dual"))


def swept(cfg: DecodeConfig, rule: str, value) -> DecodeConfig:
    return replace(cfg, cache=value) if rule == "cache" else replace(cfg, rule=rule, **{rule: value})


def baseline_config(cfg: DecodeConfig) -> DecodeConfig:
    """The paper's vanilla reference for cfg: no cache, one token per step (fixed, steps = gen_len)."""
    return replace(cfg, cache="none", rule="fixed", steps=None, refresh_every=None, sub_block_len=None,
                   credit=False, prophet=False, dpad_window=None)


def refusal(decoder: Decoder, cfg: DecodeConfig) -> str | None:
    """Why analyze cannot run this model/config at all (one line), or None."""
    if decoder.model.sampler == "renoise":
        return f"analyze reads commits of masked positions; {decoder.name} resamples whole canvases every step"
    if cfg.edit_threshold is not None:
        return "analyze compares each position's one commit with the baseline; token editing rewrites them (drop --edit-threshold)"
    if cfg.temperature > 0:
        return "analyze compares greedy runs with the greedy baseline; use --temperature 0"
    return None


def drift_refusal(decoder: Decoder, mode: str) -> str | None:
    """Why KV drift does not apply to this family in cache `mode` (one line), or None."""
    if decoder.model.attention.causal:
        return (f"kv drift: {decoder.name} attends block-causally, so its finished blocks' K/V are final "
                f"and a full forward is not its reference; drift is measured for bidirectional families")
    if not CACHE_MODES[mode].keeps_kv:
        return f"kv drift: cache {mode} recomputes every position every step; nothing is cached to drift"
    return None


def analyze(decoder: Decoder, ids: list[int], cfg: DecodeConfig, *, sweep=SWEEP, drift_modes=DRIFT_MODES) -> dict:
    """All of analyze's numbers for one prompt (token ids) under cfg. UserError when it cannot run."""
    if (why := refusal(decoder, cfg)) is not None:
        raise UserError(why)
    started = time.perf_counter()
    base = run(decoder, [ids], baseline_config(cfg))
    reference = base.canvas[0]                                   # (gen_len,) mask where not decoded
    mask = decoder.specials.mask
    main, main_drift = instrumented(decoder, ids, cfg, reference, mask, drift=cfg.cache in drift_modes)
    drift = {}
    for mode in drift_modes:
        if (why := drift_refusal(decoder, mode)) is not None:
            drift[mode] = {"refused": why}
        elif mode == cfg.cache:
            drift[mode] = main_drift
        else:
            drift[mode] = instrumented(decoder, ids, replace(cfg, cache=mode), reference, mask, drift=True)[1]
    runs = [what_if(decoder, ids, swept(cfg, rule, value), reference, mask, rule, value)
            if swept(cfg, rule, value) != cfg else
            {"rule": rule, "value": value, "nfe": main["nfe"], "agreed": main["agreement"]["agreed"],
             "compared": main["agreement"]["compared"], "agreement": main["agreement"]["rate"]}
            for rule, value in sweep]
    return {**main, "baseline": {"nfe": base.nfe, "text": base.texts[0], "config": base.config.to_dict()},
            "drift": drift, "sweep": runs, "seconds": round(time.perf_counter() - started, 3)}


def agreement(canvas: torch.Tensor, reference: torch.Tensor, mask: int) -> tuple[int, int]:
    """(agreed, compared): positions both runs decoded, and those with the same token."""
    both = (canvas != mask) & (reference != mask)
    return int((canvas[both] == reference[both]).sum()), int(both.sum())


def what_if(decoder, ids, cfg, reference, mask, rule, value) -> dict:
    result = run(decoder, [ids], cfg)
    agreed, compared = agreement(result.canvas[0], reference, mask)
    return {"rule": rule, "value": value, "nfe": result.nfe, "agreed": agreed, "compared": compared,
            "agreement": round(agreed / max(compared, 1), 4)}


def instrumented(decoder: Decoder, ids: list[int], cfg: DecodeConfig, reference: torch.Tensor, mask: int,
                 drift: bool) -> tuple[dict, dict | None]:
    """Run cfg through its stepper, reading each StepEvent; with `drift`, after each step's
    forward compare the cache with a fresh full forward. Returns (run record, drift record or None)."""
    batch = stepper(decoder, [ids], cfg)
    start = batch.canvas.starts[0]
    steps, drift_steps = [], []
    for event in batch.events():
        if not isinstance(event, StepEvent):
            continue
        chosen = event.committed[0]
        pos, tok, conf = event.positions[0][chosen], event.tokens[0][chosen], event.confidences[0][chosen]
        # rank: 1 = the most confident candidate of the step (the rules' sorted order), among the
        # positions masked before it (a whole-block step also lists committed ones as filler)
        was_masked = (batch.canvas.host[0, event.positions[0] + start] == mask) | chosen
        order = torch.argsort(event.confidences[0].masked_fill(~was_masked, float("-inf")), descending=True, stable=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(1, order.numel() + 1)
        commits = []
        for p, t, c, r in zip(pos.tolist(), tok.tolist(), conf.tolist(), rank[chosen].tolist()):
            ref = int(reference[p]) if 0 <= p < reference.numel() else mask
            commits.append({"position": p, "token": t, "confidence": round(c, 6), "rank": r,
                            "agrees": None if ref == mask else t == ref})
        span = event.span if isinstance(event.span[0], int) else ("set", event.span[1])
        steps.append({"block": event.block, "step": event.step, "nfe": event.nfe, "span": list(span),
                      "refresh": span[0] == 0, "commits": commits})
        if drift and event.step >= 0:
            drift_steps.append({"block": event.block, "step": event.step, "nfe": event.nfe,
                                "refresh": span[0] == 0, **kv_drift(batch, event, start, mask)})
    result: Result = batch.result()
    return record(result, steps, cfg), (drift_summary(drift_steps, cfg) if drift else None)


def kv_drift(batch, event: StepEvent, start: int, mask: int) -> dict:
    """Per layer: the cache the step's forward attended to against a fresh full forward over the
    canvas as that forward saw it (this step's commits undone). Over the row's valid positions."""
    model, cache = batch.decoder.model, batch.cache
    canvas = batch.canvas.host.clone()                            # (1, T) after this step's commit
    undo = event.positions[0][event.committed[0]] + start
    canvas[0, undo] = mask
    device = batch.decoder.device
    valid = batch.canvas.valid.to(device)
    fresh = model.new_cache(valid, keep_kv=True)
    T = canvas.shape[1]
    with torch.inference_mode():
        model.forward_span(canvas.to(device), 0, T, fresh, torch.full((1, 1), T - 1, device=device))
    keep = batch.canvas.valid[0]
    s, e = batch.canvas.blocks[event.block]
    region = torch.full((T,), 1)                                  # 0: before the block, 1: in it, 2: after
    region[:s], region[e:] = 0, 2
    region = region[keep]
    squared = torch.zeros(3, dtype=torch.float64)                 # the squared error in each region
    layers = {"k_cos": [], "v_cos": [], "k_err": [], "v_err": []}
    for kind, cached, ref in (("k", cache.keys, fresh.keys), ("v", cache.values, fresh.values)):
        for a, b in zip(cached, ref):
            # (1, H, T, D) -> (T, H*D) over valid positions; float64 for the comparison itself
            a = a[0].transpose(0, 1).flatten(1)[keep.to(a.device)].double()
            b = b[0].transpose(0, 1).flatten(1)[keep.to(b.device)].double()
            cos = torch.nn.functional.cosine_similarity(a, b, dim=1, eps=1e-30)
            layers[f"{kind}_cos"].append(float(cos.mean()))
            layers[f"{kind}_err"].append(float((a - b).norm() / b.norm().clamp_min(1e-30)))
            squared.index_add_(0, region.to(a.device), ((a - b) ** 2).sum(1).cpu())
    share = (squared / squared.sum()).tolist() if float(squared.sum()) > 0 else [0.0, 0.0, 0.0]
    return {**layers, "error_share": dict(zip(("before", "block", "after"), (round(x, 4) for x in share)))}


def drift_summary(steps: list[dict], cfg: DecodeConfig) -> dict:
    """The per-step, per-layer drift with its worst layer and step (non-refresh steps)."""
    cached = [s for s in steps if not s["refresh"]]
    n_layers = len(steps[0]["k_err"]) if steps else 0
    worst_layer = [max((max(s["k_err"][i], s["v_err"][i]) for s in cached), default=0.0) for i in range(n_layers)]
    mean_layer = [sum(max(s["k_err"][i], s["v_err"][i]) for s in cached) / max(len(cached), 1) for i in range(n_layers)]
    share = {k: round(sum(s["error_share"][k] for s in cached) / max(len(cached), 1), 4)
             for k in ("before", "block", "after")}                # where the error sits, mean over steps
    return {"cache": cfg.cache, "layers": n_layers, "steps": steps, "error_share": share,
            "max_error_by_layer": [round(x, 6) for x in worst_layer],
            "mean_error_by_layer": [round(x, 6) for x in mean_layer],
            "min_cosine": round(min((min(s["k_cos"] + s["v_cos"]) for s in cached), default=1.0), 6)}


def record(result: Result, steps: list[dict], cfg: DecodeConfig) -> dict:
    """The run's timeline and confidence-vs-baseline numbers."""
    blocks: dict[int, dict] = {}
    for s in steps:
        b = blocks.setdefault(s["block"], {"block": s["block"], "nfe": 0, "committed": 0})
        b["nfe"] += 1
        b["committed"] += len(s["commits"])
    commits = [c for s in steps for c in s["commits"]]
    judged = [c for c in commits if c["agrees"] is not None]
    agreed = sum(c["agrees"] for c in judged)
    return {"config": cfg.to_dict(), "text": result.texts[0], "nfe": result.nfe,
            "committed": result.committed, "tokens_per_forward": round(result.tokens_per_forward, 4),   # answer tokens
            "committed_per_forward": round(result.committed_per_forward, 4),
            "prompt_tokens": result.prompt_tokens[0], "generated_tokens": result.generated_tokens,
            "blocks": list(blocks.values()), "steps": steps,
            "agreement": {"commits": len(commits), "compared": len(judged), "agreed": agreed,
                          "rate": round(agreed / max(len(judged), 1), 4)}}
