"""Where a batch's prompts and masks sit on the canvas, and which blocks are decoded, for each
attention kind (cache_modes.Attention).

- bidirectional (LLaDA, Dream): prompts left-padded to the longest (padding masked out of
  attention, RoPE positions shifted per row), then gen_len masks; blocks start where the prompts end.
- block-causal (SDAR, Fast-dLLM v2): every row on the same absolute grid of blocks (positions
  0..T-1, no padding before a prompt), masks right after each row's own prompt up to the end of the
  block holding its token gen_len (`ceil((L + gen_len) / B) * B`, as the references; the answer
  reported is cut at gen_len tokens), the pad token
  after that (never decoded, never seen by earlier positions). The whole blocks of the shortest
  prompt are prefilled once; each row's prompt tail lives in its first decoded block. Finished
  blocks are final, so a row is the same whether decoded alone or in a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import UserError


@dataclass
class Canvas:
    host: torch.Tensor            # (B, T) token ids, the host copy
    valid: torch.Tensor           # (B, T) bool, False = left padding
    starts: list[int]             # per row: its first generated position
    ends: list[int]               # per row: the end of its generated region
    width: int                    # generated positions reported per row (from its start)
    blocks: list[tuple[int, int]]  # canvas spans decoded in order
    prefill: int                  # block-causal: [0, prefill) is computed once before the blocks

    @property
    def length(self) -> int:
        return self.host.shape[1]


def plan(prompts: list[list[int]], cfg, *, mask: int, pad: int, causal: bool, context_length: int) -> Canvas:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UserError("empty prompt: give at least one token of input")
    longest = max(len(p) for p in prompts)
    B = cfg.block_len
    T = block_end(longest + cfg.gen_len, B) if causal else longest + cfg.gen_len
    if T > context_length:
        raise UserError(f"prompt ({longest} tokens) + gen_len ({cfg.gen_len}) = {longest + cfg.gen_len} exceeds "
                        f"the model's context of {context_length} tokens")
    return (_block_causal if causal else _left_padded)(prompts, cfg, mask, pad, T)


def geometry(prompt_len: int, cfg, causal: bool) -> tuple[int, int]:
    """(width, offset) of one row's generated region: its length, and how far its first block starts
    before it (block-causal: the prompt tail shares the first block)."""
    if not causal:
        return cfg.gen_len, 0
    B = cfg.block_len
    return block_end(prompt_len + cfg.gen_len, B) - prompt_len, prompt_len % B


def block_end(n: int, block: int) -> int:
    """The end of the block holding position n - 1: n rounded up to a multiple of `block`."""
    return -(-n // block) * block


def _left_padded(prompts, cfg, mask: int, pad: int, T: int) -> Canvas:
    P = T - cfg.gen_len
    host = torch.full((len(prompts), T), mask, dtype=torch.long)
    valid = torch.ones((len(prompts), T), dtype=torch.bool)
    for row, ids in enumerate(prompts):
        host[row, :P - len(ids)] = pad
        host[row, P - len(ids):P] = torch.tensor(ids)
        valid[row, :P - len(ids)] = False
    blocks = [(P + b * cfg.block_len, P + (b + 1) * cfg.block_len) for b in range(cfg.num_blocks)]
    return Canvas(host, valid, [P] * len(prompts), [T] * len(prompts), cfg.gen_len, blocks, 0)


def _block_causal(prompts, cfg, mask: int, pad: int, T: int) -> Canvas:
    B = cfg.block_len
    host = torch.full((len(prompts), T), pad, dtype=torch.long)
    ends = []
    for row, ids in enumerate(prompts):
        end = block_end(len(ids) + cfg.gen_len, B)
        host[row, :len(ids)] = torch.tensor(ids)
        host[row, len(ids):end] = mask
        ends.append(end)
    starts = [len(p) for p in prompts]
    prefill = min(starts) // B * B
    blocks = [(s, s + B) for s in range(prefill, T, B)]
    width = max(e - s for s, e in zip(starts, ends))
    return Canvas(host, torch.ones_like(host, dtype=torch.bool), starts, ends, width, blocks, prefill)


def generated(canvas: Canvas, mask: int) -> torch.Tensor:
    """(B, width): each row's generated region from its start (mask ids past its end)."""
    out = torch.full((canvas.host.shape[0], canvas.width), mask, dtype=torch.long)
    for row, (start, end) in enumerate(zip(canvas.starts, canvas.ends)):
        piece = canvas.host[row, start:end]
        out[row, :piece.numel()] = piece
    return out


def answer_ended(canvas: Canvas, stops: torch.Tensor, mask: int) -> torch.Tensor:
    """(B,) bool: a stop token stands in the row's generated region with no mask before it, so
    nothing before it can change (block-causal decoding may stop there, mid-block)."""
    region = generated(canvas, mask)
    stop = torch.isin(region, stops)
    pending = (region == mask).long().cumsum(1) > 0                  # at or after the first mask
    return (stop & ~pending).any(1)
