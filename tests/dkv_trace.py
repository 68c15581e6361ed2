"""The cache-refresh tests' shared pieces, written for dKV-Cache (tests/accelerators/test_dkv.py) and used by
test_dllm_cache.py: a step's sorted [row, canvas position, token] commits (commits), one row's commits by
block with empty steps left out (row_steps), and the chat prompt off the block grid of 16 or cut to a
multiple of 16 tokens on it (chat_prompt; not helpers.prompt_of, which draws random ids)."""

from __future__ import annotations

import torch
from conftest import HEAVY_PROMPT

from fastdllm.decode.engine import StepEvent


def commits(event, starts):
    """A step's sorted [row, canvas position, token] commits (prompts of lengths `starts`, unpadded)."""
    c = event.committed
    rows = c.nonzero()[:, 0]
    at = event.positions[c] + torch.tensor(starts)[rows]
    return sorted([int(r), int(p), int(t)] for r, p, t in zip(rows, at, event.tokens[c]))


def chat_prompt(lm, boundary):
    """The chat prompt (off the block grid of 16), or a multiple of 16 tokens (on it)."""
    prompt = lm.encode(HEAVY_PROMPT, chat=True)
    if not boundary:
        return prompt
    longer = prompt + lm.encode(" Then test it on a few numbers, please, and explain", chat=False)
    return longer[:16 * (len(longer) // 16)]


def row_steps(events, row):
    """One row's commits, empty steps left out: [(block, sorted positions)]."""
    return [(e.block, sorted(e.positions[row][e.committed[row]].tolist())) for e in events
            if isinstance(e, StepEvent) and e.committed[row].any()]
