"""Rendering the engine's event stream: the live canvas (rich), block-by-block plain streaming,
and the stats after a run. Views read event fields; they never touch the model."""

from __future__ import annotations

import time
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from .engine import BlockEvent, Result, StepEvent

MASK_GLYPH = "░"
END_GLYPH = "·"      # a committed end-of-text / end-of-turn position (padding after the answer)


def confidence_style(c: float) -> str:
    return "bold green" if c >= 0.9 else "bold yellow" if c >= 0.7 else "bold red"


class Pieces:
    """Token id -> display text, cached (byte-level pieces of a multi-byte character show as '�')."""

    def __init__(self, tokenizer):
        self.tokenizer, self.cache = tokenizer, {}

    def __call__(self, token: int) -> str:
        if token not in self.cache:
            self.cache[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        return self.cache[token]


class LiveCanvas:
    """The canvas of row 0 as it is unmasked: finished text, the active block with placeholders and
    the latest commits coloured by confidence, a one-line summary of what is still masked."""

    def __init__(self, console: Console, tokenizer, header: str, gen_len: int, block_len: int,
                 stops: tuple[int, ...], fps: float = 10.0, offset: int = 0):
        """gen_len: positions generated; offset: how far the first block starts before them
        (block-causal families: the prompt's tail shares the first block; canvas.geometry)."""
        self.console, self.pieces, self.header = console, Pieces(tokenizer), header
        self.gen_len, self.block_len, self.stops, self.offset = gen_len, block_len, set(stops), offset
        self.tokens: list[int | None] = [None] * gen_len
        self.latest: dict[int, float] = {}           # position -> confidence of the latest step
        self.finished = Text()                       # text of finished blocks, built once
        self.block, self.step, self.nfe, self.committed = 0, 0, 0, 0
        self.ended = False
        self.started = time.perf_counter()
        self.interval, self.last_draw = 1.0 / fps, 0.0
        self.overhead = 0.0                          # seconds spent in this view
        self.live = Live(console=console, auto_refresh=False, transient=True)

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        return self.live.__exit__(*exc)

    def update(self, event) -> None:
        t0 = time.perf_counter()
        if isinstance(event, StepEvent):
            self.block, self.step, self.nfe = event.block, event.step, event.nfe
            pos, tok, conf = (event.positions[0][event.committed[0]].tolist(), event.tokens[0][event.committed[0]].tolist(),
                              event.confidences[0][event.committed[0]].tolist())
            self.latest = dict(zip(pos, conf))
            for p, t in zip(pos, tok):
                self.tokens[p] = t
            self.committed += len(pos)
        elif isinstance(event, BlockEvent):
            self.latest = {}
            if not self.ended:
                for p in range(event.start, event.end):
                    t = self.tokens[p]
                    if t in self.stops:
                        self.ended = True
                        break
                    self.finished.append(self.pieces(t))
            self.block = event.block + 1
        now = time.perf_counter()
        if isinstance(event, BlockEvent) or now - self.last_draw >= self.interval:
            self.live.update(self.render(), refresh=True)
            self.last_draw = time.perf_counter()
        self.overhead += time.perf_counter() - t0

    def render(self) -> Group:
        max_lines = max(4, self.console.height - 5)
        body = self.finished
        if body.plain.count("\n") > max_lines:         # show the tail that fits the terminal
            cut = len(body.plain)
            for _ in range(max_lines):
                cut = body.plain.rfind("\n", 0, cut)
            body = body[cut + 1:]
        body = body.copy()
        start = self.block * self.block_len - self.offset
        if start + self.block_len > 0 and start < self.gen_len and not self.ended:
            for p in range(max(start, 0), min(start + self.block_len, self.gen_len)):
                t = self.tokens[p]
                if t is None:
                    body.append(MASK_GLYPH, style="dim on grey15")
                elif t in self.stops:
                    body.append(END_GLYPH, style="dim")
                else:
                    body.append(self.pieces(t), style=confidence_style(self.latest[p]) if p in self.latest else "on grey15")
            rest = self.gen_len - start - self.block_len
            if rest > 0:
                body.append(f" ··· {rest} masked", style="dim")
        elapsed = time.perf_counter() - self.started
        blocks = -(-(self.gen_len + self.offset) // self.block_len)
        footer = Text(f"block {min(self.block + 1, blocks)}/{blocks} · step {self.step + 1} · NFE {self.nfe} · "
                      f"{self.committed / max(self.nfe, 1):.2f} tok/fwd · {elapsed:.1f}s · "
                      f"{self.committed / max(elapsed, 1e-9):.1f} tok/s", style="cyan")
        return Group(Text(self.header, style="bold"), body, footer)


class BlockStreamer:
    """Writes the answer to `out` block by block, as blocks finish (for pipes)."""

    def __init__(self, out: TextIO, tokenizer, stops: tuple[int, ...]):
        self.out, self.tokenizer, self.stops = out, tokenizer, set(stops)
        self.ids: list[int] = []
        self.written = ""
        self.ended = False

    def update(self, event) -> None:
        if not isinstance(event, BlockEvent) or self.ended:
            return
        for t in event.tokens[0].tolist():
            if t in self.stops:
                self.ended = True
                break
            self.ids.append(t)
        self._write(final=self.ended)

    def finish(self, result: Result) -> None:
        self.ids = result.ids[0]
        self._write(final=True)
        self.out.write("\n")
        self.out.flush()

    def _write(self, final: bool) -> None:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if not final:
            text = text.rstrip("\ufffd")              # an incomplete UTF-8 character: wait for the rest
        if text.startswith(self.written):
            self.out.write(text[len(self.written):])
            self.written = text
            self.out.flush()


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def stats_line(result: Result) -> str:
    return (f"{result.generated_tokens} tokens · {result.nfe} forwards · {result.tokens_per_forward:.2f} tok/forward · "
            f"{result.tokens_per_second:.1f} tok/s · {result.seconds_total:.2f} s · "
            f"peak {human_bytes(result.peak_memory_bytes)} ({result.peak_memory_kind})")


def stats_block(result: Result, info: dict, view_overhead: float | None = None) -> str:
    cfg = result.config
    rows = [
        ("load time", f"{info.get('load_seconds', 0.0):.2f} s"),
        ("first step", f"{result.seconds_first_step * 1000:.0f} ms (full-canvas forward)"),
        ("decode time", f"{result.seconds_total:.2f} s"),
        ("prompt tokens", str(sum(result.prompt_tokens))),
        ("generated tokens", f"{result.generated_tokens} (answer, up to its end token)"),
        ("forwards (NFE)", f"{result.nfe}, {result.tokens_per_forward:.2f} tokens each"),
        ("throughput", f"{result.tokens_per_second:.1f} tokens/s"),
        ("cache", f"{cfg.cache}, {human_bytes(result.cache_bytes)}"),
        ("blocks", f"{result.blocks_decoded} of {cfg.num_blocks} of {cfg.block_len} tokens"),
        ("early stop", "yes" if result.early_stopped else "no"),
        ("device / dtype", f"{info.get('device')}" + (f" ({info['cpu_capability']})" if "cpu_capability" in info else "")
         + f" / {info.get('dtype')}" + (f" ({info['quantize']})" if info.get("quantize", "none") != "none" else "")
         + (" (bf16 emulated on this CPU: slow, fp32 is faster)" if info.get("bf16") == "emulated" else "")),
        ("peak memory", f"{human_bytes(result.peak_memory_bytes)} ({result.peak_memory_kind})"),
    ]
    if view_overhead is not None:
        share = 100 * view_overhead / max(result.seconds_total, 1e-9)
        rows.append(("view overhead", f"{view_overhead * 1000:.0f} ms ({share:.1f}% of decode)"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k + ':':<{width + 2}}{v}" for k, v in rows)
