"""Where a batch's prompts and masks sit on the canvas, and which blocks are decoded, for each
attention kind (cache_modes.Attention). Rows may ask for different lengths (`gen_lens`, at most
cfg.gen_len; whole blocks under bidirectional attention): a row's masks end at its own length, and
the slots after that are padding it never decodes.

- bidirectional (LLaDA, Dream): prompts left-padded to the longest (padding masked out of
  attention, RoPE positions shifted per row), then each row's gen_len masks; blocks start where
  the prompts end. Right padding (a shorter row) is masked out of attention like left padding.
- block-causal (SDAR, Fast-dLLM v2): each row on its own grid of blocks from its first token
  (positions count from there), masks right after its prompt up to the end of the block holding
  its token gen_len (`ceil((L + gen_len) / B) * B`, as the references; the answer reported is cut
  at gen_len tokens), the pad token after that (never decoded, never seen by earlier positions).
  Rows are left-padded by whole blocks so that their first decoded blocks (each holding its
  prompt's tail) coincide; everything before that is prefilled once. Finished blocks are final, so
  a row is the same whether decoded alone or in a batch.
- bidirectional on the grid (`block_align grid`, dInfer's evaluation scripts): each row's first
  block starts at the multiple of block_len at or before its prompt's end, in the row's own
  positions, so it holds the prompt's tail; the masks follow the prompt, gen_len of them, and the
  last block ends with them (it may be shorter). Rows are left-padded by whole blocks, as
  block-causal rows are, so that a row decodes as it would alone.
- infilling (plan_infill, bidirectional only): one row of text with holes anywhere; the blocks run
  over the masked positions only, `block_len` of them at a time in canvas order (a block may span
  several short holes, with the text between them inside its span but never a candidate).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UserError


@dataclass
class Canvas:
    host: torch.Tensor            # (B, T) token ids, the host copy
    valid: torch.Tensor           # (B, T) bool, False = left padding
    starts: list[int]             # per row: its first generated position
    ends: list[int]               # per row: the end of its generated region
    width: int                    # generated positions reported per row (from its start)
    blocks: list[tuple[int, int]]  # canvas spans decoded in order
    prefill: int                  # block-causal: [0, prefill) is computed once before the blocks
    holes: list[tuple[int, int]] | None = None   # infilling: row 0's holes; the rest is fixed text

    @property
    def length(self) -> int:
        return self.host.shape[1]


def plan(prompts: list[list[int]], cfg, *, mask: int, pad: int, causal: bool, context_length: int,
         gen_lens: list[int] | None = None) -> Canvas:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UserError("empty prompt: give at least one token of input")
    gen_lens = gen_lens or [cfg.gen_len] * len(prompts)
    if any((g % cfg.block_len and not causal) or not 0 < g <= cfg.gen_len for g in gen_lens):
        raise ValueError(f"gen_lens {gen_lens}: at most gen_len {cfg.gen_len}, whole blocks of {cfg.block_len} "
                         f"unless block-causal (its rows end at the end of a block anyway)")
    if causal and cfg.block_align == "prompt":
        raise UserError("block_align prompt: block-causal attention decodes the blocks of its own grid, from the "
                        "row's first token (leave block_align unset)")
    grid = on_grid(cfg, causal)
    if not fits([len(p) for p in prompts], gen_lens, cfg.block_len, causal, context_length, grid=grid):
        longest = max(len(p) for p in prompts)
        raise UserError(f"prompt ({longest} tokens) + gen_len ({cfg.gen_len}) = {longest + cfg.gen_len} exceeds "
                        f"the model's context of {context_length} tokens")
    T = length([len(p) for p in prompts], gen_lens, cfg.block_len, causal, grid)
    return (_block_causal if causal else _on_grid if grid else _left_padded)(prompts, gen_lens, cfg, mask, pad, T)


def on_grid(cfg, causal: bool) -> bool:
    """Blocks start on the grid of block_len from each row's first token."""
    return causal or cfg.block_align == "grid"


def length(prompt_lens: list[int], gen_lens: list[int], block: int, causal: bool, grid: bool = False) -> int:
    """The canvas length T of a batch (what must fit the model's context)."""
    if not (causal or grid):
        return max(prompt_lens) + max(gen_lens)
    first = max(n // block * block for n in prompt_lens)            # the shared first decoded block
    end = (lambda n: block_end(n, block)) if causal else (lambda n: n)   # grid: the answer's end
    return max(first - n // block * block + end(n + g) for n, g in zip(prompt_lens, gen_lens))


def fits(prompt_lens: list[int], gen_lens: list[int], block: int, causal: bool, context_length: int, *,
         grid: bool = False, suffix: int = 0) -> bool:
    """The one rule for "does the canvas fit the model's context", read by `plan`, by a served request
    (serve/protocol.py: its prompt and max_tokens, before it is queued) and by a served batch
    (serve/rows.py: the rows that may share it): the canvas length T of these rows (`length`), plus
    an infilling suffix after the answer (one row), at most `context_length`."""
    return length(prompt_lens, gen_lens, block, causal, grid) + suffix <= context_length


def geometry(prompt_len: int, cfg, causal: bool) -> tuple[int, int]:
    """(width, offset) of one row's generated region: its length, and how far its first block starts
    before it (on the grid the prompt tail shares the first block)."""
    B = cfg.block_len
    if not on_grid(cfg, causal):
        return cfg.gen_len, 0
    return (block_end(prompt_len + cfg.gen_len, B) - prompt_len if causal else cfg.gen_len), prompt_len % B


def block_end(n: int, block: int) -> int:
    """The end of the block holding position n - 1: n rounded up to a multiple of `block`."""
    return -(-n // block) * block


def _left_padded(prompts, gen_lens, cfg, mask: int, pad: int, T: int) -> Canvas:
    P = max(len(p) for p in prompts)
    host = torch.full((len(prompts), T), pad, dtype=torch.long)
    valid = torch.zeros((len(prompts), T), dtype=torch.bool)
    for row, (ids, g) in enumerate(zip(prompts, gen_lens)):
        host[row, P - len(ids):P] = torch.tensor(ids)
        host[row, P:P + g] = mask
        valid[row, P - len(ids):P + g] = True
    blocks = [(P + b * cfg.block_len, P + (b + 1) * cfg.block_len) for b in range((T - P) // cfg.block_len)]
    ends = [P + g for g in gen_lens]
    return Canvas(host, valid, [P] * len(prompts), ends, T - P, blocks, 0)


def _on_grid(prompts, gen_lens, cfg, mask: int, pad: int, T: int) -> Canvas:
    B = cfg.block_len
    first = max(len(p) // B * B for p in prompts)                  # the shared first decoded block
    host = torch.full((len(prompts), T), pad, dtype=torch.long)
    valid = torch.zeros((len(prompts), T), dtype=torch.bool)
    starts, ends = [], []
    for row, (ids, g) in enumerate(zip(prompts, gen_lens)):
        shift = first - len(ids) // B * B                           # whole blocks of left padding
        host[row, shift:shift + len(ids)] = torch.tensor(ids)
        starts.append(shift + len(ids))
        ends.append(starts[-1] + g)
        host[row, starts[-1]:ends[-1]] = mask
        valid[row, shift:ends[-1]] = True
    blocks = [(s, min(s + B, T)) for s in range(first, T, B)]     # the last one ends with the answer
    return Canvas(host, valid, starts, ends, max(gen_lens), blocks, 0)


def _block_causal(prompts, gen_lens, cfg, mask: int, pad: int, T: int) -> Canvas:
    B = cfg.block_len
    first = max(len(p) // B * B for p in prompts)                  # the shared first decoded block
    host = torch.full((len(prompts), T), pad, dtype=torch.long)
    valid = torch.ones((len(prompts), T), dtype=torch.bool)
    starts, ends = [], []
    for row, (ids, g) in enumerate(zip(prompts, gen_lens)):
        shift = first - len(ids) // B * B                           # whole blocks of left padding
        valid[row, :shift] = False
        host[row, shift:shift + len(ids)] = torch.tensor(ids)
        starts.append(shift + len(ids))
        ends.append(shift + block_end(len(ids) + g, B))
        host[row, starts[-1]:ends[-1]] = mask
    blocks = [(s, s + B) for s in range(first, T, B)]
    width = max(e - s for s, e in zip(starts, ends))
    return Canvas(host, valid, starts, ends, width, blocks, first)


def plan_infill(row: list[int], holes: list[tuple[int, int]], cfg, *, mask: int, context_length: int,
                causal: bool, shifted: bool, name: str = "this model") -> Canvas:
    """The canvas of one template row (infill.Filling: text tokens, mask ids at its holes)."""
    if cfg.block_align == "grid":
        raise UserError("block_align grid: infilling runs its blocks over the holes' masks, not a grid (unset it)")
    if causal:
        raise UserError(f"{name} cannot fill holes: its attention is causal between blocks, so what it writes "
                        f"never sees the text after it (infilling needs a bidirectional family: LLaDA, Dream)")
    if not holes:
        raise UserError("nothing to fill: the template has no holes")
    if len(row) > context_length:
        raise UserError(f"the template with its holes is {len(row)} tokens ({sum(e - s for s, e in holes)} in "
                        f"holes); the model's context is {context_length} tokens")
    if shifted and holes[0][0] == 0:
        raise UserError(f"the template starts with a hole, but {name} predicts each token from the one before "
                        f"it: put some text before the first hole")
    masked = [p for s, e in holes for p in range(s, e)]
    chunks = [masked[i:i + cfg.block_len] for i in range(0, len(masked), cfg.block_len)]
    host = torch.tensor([row], dtype=torch.long)
    if not bool((host[0, masked] == mask).all()) or int((host == mask).sum()) != len(masked):
        raise ValueError("the row's mask ids and its holes disagree")
    start, end = holes[0][0], holes[-1][1]
    return Canvas(host, torch.ones_like(host, dtype=torch.bool), [start], [end], end - start,
                  [(c[0], c[-1] + 1) for c in chunks], 0, list(holes))


def generated(canvas: Canvas, mask: int) -> torch.Tensor:
    """(B, width): each row's generated region from its start (mask ids past its end)."""
    out = torch.full((canvas.host.shape[0], canvas.width), mask, dtype=torch.long)
    for row, (start, end) in enumerate(zip(canvas.starts, canvas.ends)):
        piece = canvas.host[row, start:end]
        out[row, :piece.numel()] = piece
    return out


def answer_ended(canvas: Canvas, stops: torch.Tensor, mask: int) -> torch.Tensor:
    """(B,) bool: nothing before the row's end can change any more: a stop token stands in its
    generated region with no mask before it (block-causal decoding may stop there, mid-block), or
    no mask is left in the region (a row shorter than the batch's longest; infilling: only this)."""
    region = generated(canvas, mask)
    stop = torch.isin(region, stops)
    pending = (region == mask).long().cumsum(1) > 0                  # at or after the first mask
    lengths = torch.tensor([e - s for s, e in zip(canvas.starts, canvas.ends)])
    full = ~((region == mask) & (torch.arange(region.shape[1])[None, :] < lengths[:, None])).any(1)
    return full if canvas.holes else (stop & ~pending).any(1) | full
