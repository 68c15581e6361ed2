"""CreditDecoding (inclusionAI/dInfer's `use_credit`, `CreditThresholdParallelDecoder`;
docs/accelerators/credit.md 4): a logits transform before the confidence, with per-block state.

A token the model keeps predicting at a masked position, step after step, gains *credit*; the
logits the step decides on are `logits + alpha * log(1 + credit)`, so a consistent token crosses
the rule's threshold earlier. Per call on a block's logits (B, K, V):

    1. not the block's first call: credit *= beta (the whole block, every row, as theirs)
    2. (p, j) = max and argmax of softmax(logits) over the full vocabulary (the mask id included)
    3. at every candidate (a masked position): credit[b, slot, j] += p ** gamma
    4. fused = logits + alpha * log(credit + 1), what `selection.predict` then reads unchanged

The state is one dense (B, L, V) matrix, as theirs, in fp32 or better (float32 for bf16/fp16/fp32
logits, float64 for float64 ones). Decided against their code (docs/accelerators/credit.md 4.4): the
credit is zeroed at every block start (theirs survives an early-stopped generation under the same
block key), one matrix is reused for every block, and each row's credit is its own (their batch
shares only the call counter, which every row of a block steps together anyway).
"""

from __future__ import annotations

import torch

from ..errors import UserError

LIMIT_BYTES = 1 << 30          # the most memory a batch's credit may take


class CreditTrace:
    """The credit of the active block, (B, L, V), per row; `reset` at every block start."""

    def __init__(self, cfg, batch: int, vocab: int | None = None):
        self.alpha, self.gamma, self.beta = cfg.credit_alpha, cfg.credit_gamma, cfg.credit_beta
        self.batch, self.block_len = batch, cfg.block_len
        if vocab is not None and (need := batch * cfg.block_len * vocab * 4) > LIMIT_BYTES:
            raise UserError(f"credit needs {need / 2**30:.2f} GiB (batch {batch} x block_len {cfg.block_len} x "
                            f"vocabulary {vocab} x 4 bytes), above its limit of 1 GiB: use a smaller batch or block_len")
        self.credit: torch.Tensor | None = None      # (B, L, V), allocated at the first update
        self.calls = 0                               # updates since the block started

    def reset(self) -> None:
        """A new block: no credit, and its first update does not decay."""
        self.calls = 0
        if self.credit is not None:
            with torch.inference_mode():                     # the engine's steps allocate it there
                self.credit.zero_()

    def _state(self, logits: torch.Tensor) -> torch.Tensor:
        """The (B, L, V) matrix for logits (B, K, V): fp32 or better, on their device."""
        work = torch.promote_types(logits.dtype, torch.float32)
        shape = (self.batch, self.block_len, logits.shape[-1])
        c = self.credit
        if c is None or c.shape != shape or c.dtype != work or c.device != logits.device:
            self.credit = torch.zeros(shape, dtype=work, device=logits.device)
        return self.credit

    def update(self, slots: torch.Tensor, candidate: torch.Tensor, logits: torch.Tensor) -> None:
        """Steps 1-3. slots (B, K): the block offsets (0 .. L-1) of the logits' rows, distinct per
        row; candidate (B, K) bool: the masked positions that gain credit; logits (B, K, V)."""
        credit = self._state(logits)
        if self.calls:
            credit.mul_(self.beta)
        work = credit.dtype
        top, j = logits.max(-1)                                          # (B, K) raw argmax, first on ties
        p = (top.to(work) - logits.to(work).logsumexp(-1)).exp()         # its softmax probability
        gain = p.pow(self.gamma) * candidate.to(work)                    # nothing at a non-candidate
        rows = torch.arange(slots.shape[0], device=slots.device)[:, None].expand_as(slots)
        credit.index_put_((rows, slots, j), gain, accumulate=True)       # (b, slot, j) distinct: a plain add
        self.calls += 1

    def transform(self, slots: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Step 4: (B, K, V) fused logits, fp32 or better (a new tensor; `logits` is left alone)."""
        credit = self._state(logits) if self.credit is None else self.credit
        rows = torch.arange(slots.shape[0], device=slots.device)[:, None]
        gathered = credit[rows, slots]                                   # (B, K, V), a copy
        return gathered.add_(1).log_().mul_(self.alpha).add_(logits)     # logits + alpha log(C + 1)

    def __call__(self, slots: torch.Tensor, candidate: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """One step's decision logits: update the credit with this step's logits, then fuse."""
        self.update(slots, candidate, logits)
        return self.transform(slots, logits)

    @property
    def nbytes(self) -> int:
        return 0 if self.credit is None else self.credit.numel() * self.credit.element_size()
