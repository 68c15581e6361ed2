"""Rendering the engine's event stream: the live canvas (rich) and block-by-block plain streaming
(the stats after a run: stats.py). Views read event fields; they never touch the model."""

from __future__ import annotations

import time
from typing import TextIO

import torch
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from ..decode.engine import BlockEvent, Result, StepEvent
from ..units import plural
from .screen import fit_frame

MASK_GLYPH = "░"
EDIT_STYLE = "bold magenta"   # a token that token editing (LLaDA2.1) has just overwritten
FRONTIER_STYLE = "bold black on yellow"   # structured output: the masked position its grammar checks next
END_GLYPH = "·"      # a committed end-of-text / end-of-turn position (padding after the answer)


def written_before_end(tokens: list[int | None], stops: set[int]) -> int:
    """Answer tokens in a stretch of the canvas: positions written (not None) before its first end token."""
    n = 0
    for t in tokens:
        if t in stops:
            break
        n += t is not None
    return n


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


class LiveView:
    """What both live views share: the rich Live display on stderr, redrawn at most `fps` times a
    second (and at every block's end), the step counters and the latest commits of row 0."""

    def __init__(self, console: Console, tokenizer, header: str, stops: tuple[int, ...], tokens: list[int | None],
                 offset: int, fps: float = 10.0):
        """tokens: what is shown, None where masked; offset: the index in `tokens` of generated
        position 0 (events count positions from a row's first generated position)."""
        self.console, self.pieces, self.header, self.stops = console, Pieces(tokenizer), header, set(stops)
        self.tokens, self.offset = tokens, offset
        self.latest: dict[int, float] = {}           # index in tokens -> confidence of the latest step
        self.edited: set[int] = set()                # token editing: indices the latest step overwrote
        self.edits = 0                               # tokens overwritten so far
        self.deleted = self.inserted = 0             # InDel (LLaDA2.2): DELETE / SPLIT tokens written so far
        self.noise: set[int] = set()                 # renoising samplers: positions holding noise now
        self.entropy: float | None = None            # renoising samplers: the canvas's mean entropy
        self.block, self.step, self.nfe, self.committed = 0, 0, 0, 0
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
        if isinstance(event, StepEvent) and event.renoised:
            self.renoise_step(event)
        elif isinstance(event, StepEvent):
            self.block, self.step, self.nfe = event.block, event.step, event.nfe
            chosen = event.committed[0]
            edited = event.edited[0] if event.edited is not None else torch.zeros_like(chosen)
            wrote = chosen | edited                   # new tokens at masks, and edits of written ones
            at = (event.positions[0][wrote] + self.offset).tolist()
            self.latest = dict(zip(at, event.confidences[0][wrote].tolist()))
            self.edited = set((event.positions[0][edited] + self.offset).tolist())
            for p, t in zip(at, event.tokens[0][wrote].tolist()):
                self.tokens[p] = t
            self.committed += int(chosen.sum())
            self.edits += len(self.edited)
            if event.masks is not None:
                self.indel_step(event)
        elif isinstance(event, BlockEvent):
            self.latest, self.noise, self.edited = {}, set(), set()
            if self.entropy is not None:                 # a renoising sampler: its argmax is the block
                for p, t in zip(range(event.start + self.offset, event.end + self.offset), event.tokens[0].tolist()):
                    if 0 <= p < len(self.tokens):
                        self.tokens[p] = t
                self.committed += event.end - event.start
            self.block_done(event)
            self.block = event.block + 1
        now = time.perf_counter()
        if isinstance(event, BlockEvent) or now - self.last_draw >= self.interval:
            self.live.update(self.render(), refresh=True)
            self.last_draw = time.perf_counter()
        self.overhead += time.perf_counter() - t0

    def indel_step(self, event: StepEvent) -> None:
        """InDel moved tokens inside the block: the whole block is redrawn from the event (masks
        where it has masks now); the footer counts deletions and insertions."""
        at = (event.positions[0] + self.offset).tolist()
        for p, t, m in zip(at, event.tokens[0].tolist(), event.masks[0].tolist()):
            if 0 <= p < len(self.tokens):
                self.tokens[p] = None if m else t
        self.latest = {p: c for p, c in self.latest.items() if self.tokens[p] is not None}
        self.deleted += int(event.deleted[0].sum())
        self.inserted += int(event.inserted[0].sum())

    def renoise_step(self, event: StepEvent) -> None:
        """The whole canvas changes: accepted positions show their sample coloured by certainty
        (exp(-entropy)), the others the noise they were reset to, dim."""
        self.block, self.step, self.nfe = event.block, event.step, event.nfe
        at = (event.positions[0] + self.offset).tolist()
        accepted, certainty = event.committed[0].tolist(), event.confidences[0].exp().tolist()
        self.latest = {p: c for p, a, c in zip(at, accepted, certainty) if a}
        self.noise = {p for p, a in zip(at, accepted) if not a}
        for p, t in zip(at, event.tokens[0].tolist()):
            if 0 <= p < len(self.tokens):
                self.tokens[p] = t
        self.entropy = -float(event.confidences[0].mean())

    def block_done(self, event: BlockEvent) -> None:
        pass

    def render(self) -> Group:
        raise NotImplementedError

    def answer_tokens(self) -> int:
        """Answer tokens of row 0 written so far (renoising samplers: those of finished blocks)."""
        return self.committed

    def frame(self, body: Text, blocks: int, focus: int | None = None) -> Group:
        """Header, body and status line, fitted to the terminal (screen.fit_frame; focus: the
        body's character offset to keep in view, the front)."""
        elapsed = time.perf_counter() - self.started
        answer = self.answer_tokens()
        share = (f"mean entropy {self.entropy:.3f}" if self.entropy is not None
                 else f"{answer / max(self.nfe, 1):.2f} tok/fwd ({self.committed / max(self.nfe, 1):.2f} committed)")
        share += f" · {plural(self.edits, 'edit')}" if self.edits else ""
        share += f" · {self.deleted} deleted · {self.inserted} inserted" if self.deleted or self.inserted else ""
        footer = Text(f"block {min(self.block + 1, blocks)}/{blocks} · step {self.step + 1} · NFE {self.nfe} · "
                      f"{share} · {elapsed:.1f}s · {answer / max(elapsed, 1e-9):.1f} tok/s", style="cyan")
        return fit_frame(self.console, Text(self.header, style="bold"), body, footer, focus)


class LiveCanvas(LiveView):
    """The canvas of row 0 as it is unmasked: finished text, the active block with placeholders and
    the latest commits coloured by confidence, a one-line summary of what is still masked."""

    def __init__(self, console: Console, tokenizer, header: str, gen_len: int, block_len: int,
                 stops: tuple[int, ...], fps: float = 10.0, offset: int = 0, constrained: bool = False):
        """gen_len: positions generated; offset: how far the first block starts before them
        (block-causal families: the prompt's tail shares the first block; canvas.geometry);
        constrained: structured output, whose frontier (the first masked position, where the
        grammar is checked) is drawn apart (docs/specs/structured-output.md)."""
        super().__init__(console, tokenizer, header, stops, [None] * gen_len, 0, fps)
        self.gen_len, self.block_len, self.block_offset = gen_len, block_len, offset
        self.finished = Text()                       # text of finished blocks, built once
        self.ended = False
        self.constrained = constrained

    def block_done(self, event: BlockEvent) -> None:
        if not self.ended:
            for p in range(event.start, event.end):
                t = self.tokens[p]
                if t in self.stops:
                    self.ended = True
                    break
                self.finished.append(self.pieces(t))

    def answer_tokens(self) -> int:
        return self.committed if self.entropy is not None else written_before_end(self.tokens, self.stops)

    def render(self) -> Group:
        body = self.finished
        if body.plain.count("\n") > self.console.height:   # only the tail can be in view: wrap no more
            cut = len(body.plain)
            for _ in range(self.console.height):
                cut = body.plain.rfind("\n", 0, cut)
            body = body[cut + 1:]
        body = body.copy()
        start, front = self.block * self.block_len - self.block_offset, None
        if start + self.block_len > 0 and start < self.gen_len and not self.ended:
            frontier = self.constrained
            for p in range(max(start, 0), min(start + self.block_len, self.gen_len)):
                t = self.tokens[p]
                if t is None:
                    front = len(body) if front is None else front
                    body.append(MASK_GLYPH, style=FRONTIER_STYLE if frontier else "dim on grey15")
                    frontier = False
                elif p in self.noise:
                    body.append(self.pieces(t), style="dim italic")
                elif p in self.edited:
                    body.append(self.pieces(t) if t not in self.stops else END_GLYPH, style=EDIT_STYLE)
                elif t in self.stops:
                    body.append(END_GLYPH, style="dim")
                else:
                    body.append(self.pieces(t), style=confidence_style(self.latest[p]) if p in self.latest else "on grey15")
            rest = self.gen_len - start - self.block_len
            if rest > 0:
                body.append(f" ··· {rest} masked", style="dim")
        return self.frame(body, -(-(self.gen_len + self.block_offset) // self.block_len), front)


class InfillCanvas(LiveView):
    """The live view of a template being filled: its text dim, the holes' masks as placeholders,
    fills as they are committed (the latest coloured by confidence); the lines around the active
    block when the whole does not fit the terminal."""

    def __init__(self, console: Console, tokenizer, header: str, ids: list[int], holes: list[tuple[int, int]],
                 block_len: int, stops: tuple[int, ...], fps: float = 10.0):
        self.holes, self.hole_at = holes, {p for s, e in holes for p in range(s, e)}
        super().__init__(console, tokenizer, header, stops, [None if p in self.hole_at else t for p, t in enumerate(ids)],
                         holes[0][0], fps)
        self.masked = sorted(self.hole_at)           # block b: masked[b * block_len:(b + 1) * block_len]
        self.block_len = block_len

    def answer_tokens(self) -> int:
        return sum(written_before_end(self.tokens[s:e], self.stops) for s, e in self.holes)

    def render(self) -> Group:
        body, focus = Text(), 0
        active = self.masked[min(self.block * self.block_len, len(self.masked) - 1)]
        for p, t in enumerate(self.tokens):
            if p == active:
                focus = len(body.plain)
            if p not in self.hole_at:
                body.append(self.pieces(t), style="dim")
            elif t is None:
                body.append(MASK_GLYPH, style="dim on grey15")
            elif t in self.stops:
                body.append(END_GLYPH, style="dim")
            else:
                body.append(self.pieces(t), style=confidence_style(self.latest[p]) if p in self.latest else "")
        return self.frame(body, -(-len(self.masked) // self.block_len), focus)   # the lines around the active block


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
