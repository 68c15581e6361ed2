"""The figures of a finished run for people: one stats line, or a block of one figure per line
(`-v`). Tokens per forward count answer tokens; the positions committed stand beside them."""

from __future__ import annotations

from ..decode.events import Result
from ..units import human_bytes, plural


def stats_line(result: Result) -> str:
    """tok/forward: answer tokens per forward; beside it, the positions committed (end padding included)."""
    return (f"{plural(result.generated_tokens, 'token')} · {plural(result.nfe, 'forward')} · "
            f"{result.tokens_per_forward:.2f} tok/forward ({result.committed_per_forward:.2f} committed) · "
            f"{result.tokens_per_second:.1f} tok/s · {result.seconds_total:.2f} s · "
            f"peak {human_bytes(result.peak_memory_bytes)} ({result.peak_memory_kind})")


def _blocks(result: Result) -> int:
    if result.holes:
        return -(-sum(len(h) for h in result.holes[0]) // result.config.block_len)
    return result.config.num_blocks


def edits_text(result: Result) -> str:
    cfg = result.config
    per_block = result.edits / max(result.blocks_decoded, 1)
    return (f"{result.edits} ({per_block:.1f} per block; edit threshold {cfg.edit_threshold:g}, "
            f"at most {plural(cfg.max_post_steps, 'edit-only round')})")


def stats_block(result: Result, info: dict, view_overhead: float | None = None) -> str:
    cfg = result.config
    rows = [
        ("load time", f"{info.get('load_seconds', 0.0):.2f} s"),
        ("first step", f"{result.seconds_first_step * 1000:.0f} ms (full-canvas forward)"),
        ("decode time", f"{result.seconds_total:.2f} s"),
        ("prompt tokens", str(sum(result.prompt_tokens))),
        ("generated tokens", f"{result.generated_tokens} (answer, up to its end token)"),
        ("forwards (NFE)", f"{result.nfe}, {result.tokens_per_forward:.2f} answer tokens each "
                           f"({result.committed_per_forward:.2f} positions committed, end padding included)"),
        ("throughput", f"{result.tokens_per_second:.1f} tokens/s"),
        ("cache", f"{cfg.cache}, {human_bytes(result.cache_bytes)}"),
        ("blocks", f"{result.blocks_decoded} of {_blocks(result)} of {plural(cfg.block_len, 'token')}"
                   + (" (over the holes' masks)" if result.holes else "")),
        ("early stop", "yes" if result.early_stopped else "no"),
        *([("token edits", edits_text(result))] if cfg.edit_threshold is not None else []),
        ("device / dtype", f"{info.get('device')}" + (f" ({info['cpu_capability']}, {plural(info['threads'], 'thread')})"
                                                      if "cpu_capability" in info else "")
         + f" / {info.get('dtype')}" + (f" ({info['quantize']})" if info.get("quantize", "none") != "none" else "")
         + (f" ({plural(info['portable_4bit_layers'], 'layer')} on bitsandbytes' portable 4-bit kernel: shapes its bf16 CPU "
            "kernel cannot take)" if info.get("portable_4bit_layers") else "")
         + (" (bf16 emulated on this CPU: slow, fp32 is faster)" if info.get("bf16") == "emulated" else "")),
        *([("dtype choice", info["dtype_choice"])] if info.get("dtype_choice") else []),   # --dtype auto's pick
        ("peak memory", f"{human_bytes(result.peak_memory_bytes)} ({result.peak_memory_kind})"),
    ]
    if view_overhead is not None:
        share = 100 * view_overhead / max(result.seconds_total, 1e-9)
        rows.append(("view overhead", f"{view_overhead * 1000:.0f} ms ({share:.1f}% of decode)"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k + ':':<{width + 2}}{v}" for k, v in rows)
