"""KLASS, KL-Adaptive Stability Sampling (Kim et al., arXiv 2511.05664; docs/accelerators/klass.md 6.1): a
step commits every masked position of the active block that is *ready*, confident (p(x0) >
threshold, strictly) and stable (KL(p_t || p_{t-1}) < klass_kl at each of its last klass_history
steps); a row with none ready commits the fixed schedule's most confident, as LLaDA's loop.

The state, per row, across the steps of a block (KlassTrace, beside credit.py's CreditTrace):

    prev    (B, L, V) float64   log(p + 1e-12) of the previous forward at each offset of the block
    known   (B, L) bool         where the previous forward computed that distribution
    streak  (B, L) long         consecutive steps of this block whose KL was < klass_kl
    ahead   (B, L', V) logits   each row's last forward's logits at the next block, where its span covered it

KL = sum_v p (log(p + eps) - prev), eps 1e-12, p the float64 softmax over the full vocabulary (the
mask id included), as the authors'. A position with no previous distribution has KL = +inf (never
stable). The authors' "block-local step >= H - 1 and the last H KLs < klass_kl" is `streak >= H`
with the streak zeroed at every block start: a streak of H needs H steps of this block, and the
window of a step >= H - 1 holds only this block's KLs, the first of them against the previous
block's last forward, which `ahead` keeps (docs/accelerators/klass.md 6.1, "history across blocks").
"""

from __future__ import annotations

import torch

from ..errors import UserError

EPS = 1e-12                    # theirs: log(p + eps) on both sides
READY = 2.0                    # added to a ready candidate's confidence (at most 1): the ready rank first
LIMIT_BYTES = 2 << 30          # the most memory prev + ahead may take


def ready_key(conf, stable, cfg):
    """(B, K) ranking key for select(): the confidences, + READY where stable and conf > threshold."""
    return conf + READY * (stable & (conf > cfg.threshold))


def ready_count(sorted_key, scheduled):
    """(B,) commits: every ready candidate, or where a row has none the schedule's count."""
    ready = (sorted_key >= READY).sum(-1)
    return torch.where(ready > 0, ready, scheduled)


class KlassTrace:
    """The KL history of the active block, per row; `start_block` at every block start."""

    def __init__(self, cfg, batch: int, vocab: int | None = None):
        self.bar, self.history, self.block_len, self.batch = cfg.klass_kl, cfg.klass_history, cfg.block_len, batch
        if vocab is not None and (need := 2 * batch * cfg.block_len * vocab * 8) > LIMIT_BYTES:
            raise UserError(f"klass needs {need / 2**30:.2f} GiB (2 x batch {batch} x block_len {cfg.block_len} x "
                            f"vocabulary {vocab} x 8 bytes), above its limit of 2 GiB: use a smaller batch or block_len")
        self.prev = self.known = self.streak = None    # allocated at the first step, on the logits' device
        self.ahead = self.ahead_known = None           # (B, L', V) each row's last next-block logits; (B,) bool
        self.next_block: tuple[int, int] | None = None
        self.widened = 0                               # columns the current forward added for the next block

    def start_block(self, next_block: tuple[int, int] | None) -> None:
        """A new block (the engine's canvas.blocks[b + 1] is `next_block`, None for the last): each row's
        last forward's logits at this block, where it computed them, become its previous distributions."""
        self.next_block = next_block
        if self.prev is None:
            return
        with torch.inference_mode():                      # the engine's steps allocate the state there
            self.streak.zero_()
            self.known.zero_()
            if self.ahead is not None:
                n = self.ahead.shape[1]
                self.prev[:, :n] = log_p(self.ahead)[1]
                self.known[:, :n] = self.ahead_known[:, None]
                self.ahead_known.zero_()

    def widen(self, span, positions: torch.Tensor) -> torch.Tensor:
        """positions (B, K) -> (B, K + L') with the next block's positions appended when the step's
        span recomputes all of them (none, prefix; dual at a refresh); else positions unchanged."""
        nb = self.next_block
        covers = nb is not None and isinstance(span[0], int) and span[0] <= nb[0] and span[1] >= nb[1]
        if not covers:
            self.widened = 0
            return positions
        extra = torch.arange(nb[0], nb[1]).expand(positions.shape[0], -1)
        self.widened = extra.shape[1]
        return torch.cat([positions, extra], dim=1)

    def split(self, logits: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """The forward's logits (B, K + L', V) -> the block's (B, K, V), keeping the next block's as the
        live rows' `ahead` (live (B,): rows with a candidate). A row whose block is done idles while others
        finish theirs: its previous forward stays its own last one, as when it decodes alone."""
        if self.widened:
            ahead, logits = logits[:, -self.widened:], logits[:, :-self.widened]
            if self.ahead is None or self.ahead.shape != ahead.shape or self.ahead.device != ahead.device:
                self.ahead = torch.zeros_like(ahead)
                self.ahead_known = torch.zeros(ahead.shape[0], dtype=torch.bool, device=ahead.device)
            self.ahead[live] = ahead[live]                # a copy: a CUDA graph's output is overwritten
        if self.ahead is not None:
            self.ahead_known[live] = bool(self.widened)   # this row's last forward did (not) read the next block
        return logits

    def _state(self, logits: torch.Tensor) -> None:
        shape, device = (self.batch, self.block_len), logits.device
        if self.prev is None or self.prev.device != device or self.prev.shape[-1] != logits.shape[-1]:
            self.prev = torch.zeros(*shape, logits.shape[-1], dtype=torch.float64, device=device)
            self.known = torch.zeros(shape, dtype=torch.bool, device=device)
            self.streak = torch.zeros(shape, dtype=torch.long, device=device)

    def stable(self, offsets: torch.Tensor, candidate: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """(B, K) bool: the candidates whose last `history` KLs are all below the bar. offsets (B, K):
        the block offsets (0 .. L-1) of the logits' rows, distinct per row; logits (B, K, V). Every
        offset asked (candidates and filler) records this step's distribution for the next."""
        self._state(logits)
        rows = torch.arange(offsets.shape[0], device=offsets.device)[:, None]
        p, log_now = log_p(logits)                                              # (B, K, V) float64
        kl = (p * (log_now - self.prev[rows, offsets])).sum(-1)                 # (B, K)
        kl = kl.masked_fill(~self.known[rows, offsets], float("inf"))           # no previous distribution
        streak = (self.streak[rows, offsets] + 1) * (kl < self.bar)
        self.streak[rows, offsets] = streak
        self.prev[rows, offsets] = log_now
        self.known[rows, offsets] = True
        return candidate & (streak >= self.history)


def log_p(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, log(p + eps)) in float64 over the full vocabulary, as theirs."""
    p = torch.softmax(logits.double(), -1)
    return p, p.add(EPS).log_()
