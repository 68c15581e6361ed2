"""The live view on a small terminal: every frame it draws fits the screen (no line wider than the
console, at most height - 1 lines, so rich neither crops it nor loses count of the terminal's
wrapping), the status line is always its last line and the unmasking front stays in view; the
status line's tokens per forward count answer tokens, committed positions beside them."""

from __future__ import annotations

import io

import pytest
import torch
from rich.cells import cell_len
from rich.console import Console

from fastdllm.decode.engine import BlockEvent, StepEvent
from fastdllm.terminal.view import MASK_GLYPH, InfillCanvas, LiveCanvas

END, NEWLINE, WORD, LONG, FIRST = 1, 6, 5, 7, 8
PIECES = {END: "<end>", NEWLINE: "\n", WORD: "word ", LONG: "a_long_identifier_wider_than_the_screen_" * 2,
          FIRST: "first"}


class Tokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(PIECES[i] for i in ids)


def small_terminal(height: int = 12, width: int = 40) -> Console:
    """As cli/terminal.py's err_console (soft wrap), on a terminal of height x width."""
    return Console(file=io.StringIO(), width=width, height=height, force_terminal=True, soft_wrap=True,
                   highlight=False, markup=False)


def events(answer: list[int], gen_len: int, block_len: int, per_step: int = 4):
    """A run that commits `per_step` positions a step, left to right; the canvas is `answer` then END."""
    canvas = (answer + [END] * gen_len)[:gen_len]
    nfe = 0
    for b, start in enumerate(range(0, gen_len, block_len)):
        for step, at in enumerate(range(start, start + block_len, per_step)):
            nfe += 1
            pos = torch.arange(at, at + per_step)[None]
            yield StepEvent(block=b, step=step, nfe=nfe, span=(0, gen_len), positions=pos,
                            tokens=torch.tensor([canvas[at:at + per_step]]), confidences=torch.full((1, per_step), 0.95),
                            committed=torch.ones(1, per_step, dtype=torch.bool))
        yield BlockEvent(block=b, start=start, end=start + block_len, tokens=torch.tensor([canvas[start:start + block_len]]),
                         ended=torch.tensor([END in canvas[:start + block_len]]))


def frames_of(view, stream) -> list[str]:
    """Every frame the view hands to rich's Live (every event draws one), as Live draws it on a
    soft-wrapping console: its lines, joined."""
    drawn = []
    as_printed = view.console.options.update(no_wrap=True, overflow="ignore")   # Console.print under soft_wrap
    view.live.update = lambda frame, refresh=False: drawn.append("\n".join(
        "".join(segment.text for segment in line) for line in view.console.render_lines(frame, as_printed, pad=False)))
    for event in stream:
        view.update(event)
    return drawn


def assert_fits(frame: str, console: Console) -> list[str]:
    lines = frame.split("\n")
    assert len(lines) <= console.height - 1, frame
    assert all(cell_len(line) <= console.width for line in lines), frame
    assert "NFE" in lines[-1] or "NFE" in lines[-2] or "NFE" in lines[-3], frame   # the status line closes it
    return lines


@pytest.mark.parametrize("height,width", [(12, 40), (8, 30), (40, 100)])
def test_a_tall_answer_keeps_the_front_and_the_status_line_in_view(height, width):
    console = small_terminal(height, width)
    answer = [FIRST] + [WORD, WORD, NEWLINE, LONG, NEWLINE] * 40        # 201 tokens, 80 lines, some wrapping
    view = LiveCanvas(console, Tokenizer(), "tiny · profile default · cache dual · threshold 0.9", 256, 32, (END,), fps=1e9)
    frames = frames_of(view, events(answer, 256, 32))
    assert len(frames) == 8 * (8 + 1)
    for i, frame in enumerate(frames):
        lines = assert_fits(frame, console)
        assert lines[0].startswith("tiny")                             # the header stays at the top
        block, event = divmod(i, 9)                                    # 8 steps, then the block's end
        if block < 201 // 32 and event != 7:                           # the answer goes on: its front shows
            assert MASK_GLYPH in frame, frame
    assert "first" not in frames[-1]                                   # the tail is shown, not the start


def test_the_status_line_counts_answer_tokens_beside_committed_positions():
    console = small_terminal(20, 120)
    view = LiveCanvas(console, Tokenizer(), "tiny", 64, 32, (END,), fps=1e9)
    frames = frames_of(view, events([WORD] * 4, 64, 32, per_step=8))   # 4 answer tokens, 60 end tokens
    assert "4.00 tok/fwd (8.00 committed)" in frames[0]                # step 1: 4 words and 4 end tokens
    assert "0.50 tok/fwd (8.00 committed)" in frames[-1]               # 4 answer tokens in 8 forwards


def test_infill_keeps_the_active_hole_in_view():
    console = small_terminal(10, 40)
    ids = [WORD, NEWLINE] * 60 + [WORD] * 8 + [NEWLINE, WORD] * 60     # the hole: 8 positions at line 60
    hole = (120, 128)
    view = InfillCanvas(console, Tokenizer(), "tiny · infill", ids, [hole], 8, (END,), fps=1e9)
    step = StepEvent(block=0, step=0, nfe=1, span=(0, len(ids)), positions=torch.tensor([[0, 1]]),
                     tokens=torch.tensor([[LONG, WORD]]), confidences=torch.full((1, 2), 0.9),
                     committed=torch.ones(1, 2, dtype=torch.bool))
    frames = frames_of(view, [step])
    lines = assert_fits(frames[0], console)
    assert any(MASK_GLYPH in line for line in lines)                   # the hole's masks are on screen
    assert "a_long_identifier" in frames[0]                            # and its first fill
