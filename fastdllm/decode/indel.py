"""LLaDA2.2's insert/delete (InDel) decoding (docs/specs/llada2-2.md §3): LLaDA2.1's M2T + T2T editing
plus two edit tokens, DELETE (the position is removed, the block shifts left and is padded with a
mask) and SPLIT (a mask opens before the position's previous token). Not a second engine: it plans
the block-causal canvas, forwards whole blocks through the cache (prefix, none, or dual without
sub-blocks), and yields the same StepEvent / BlockEvent / Result as mask_loop.Batch, with each step's
deletions and insertions in the event.

A row's state in its active block (`RowBlock`) is host Python over 32 positions, as the reference
decoders keep it; the rows of a batch are independent (a finished row rides along, unchanged).
Greedy only; the mask id is never predicted."""

from __future__ import annotations

from typing import Iterator

import torch

from ..errors import UserError
from .cache_modes import span_for
from .canvas import answer_ended
from .events import BlockEvent, StepEvent
from .graphs import SpanForward
from .step import complete_block
from .stepper import Stepper


def indel_ids(decoder) -> tuple[int, int]:
    config = decoder.model.config
    ids = getattr(config, "delete_token_id", None), getattr(config, "split_token_id", None)
    if None in ids:
        raise UserError(f"indel: {decoder.name}'s config.json names no delete_token_id / split_token_id "
                        f"(LLaDA2.2's edit tokens)")
    return ids


class RowBlock:
    """One row's InDel state in its active block (docs §3): prompt and original-mask flags, the
    post-edit rounds, the block states seen and the tokens written per offset (anti-loop)."""

    def __init__(self, tokens: list[int], mask: int, first: int):
        """first: the block offset of the row's first generated position (before it: prompt)."""
        self.prompt = [i < first or t != mask for i, t in enumerate(tokens)]
        self.orig = [t == mask and i >= first for i, t in enumerate(tokens)]
        self.post, self.steps, self.seen, self.history = 0, 0, set(), {}
        self.live = True

    def step(self, cur: list[int], logits: torch.Tensor, cfg, mask: int, delete: int, split: int):
        """cur: the block's tokens; logits (L, V). Returns the new tokens (None: nothing written, the
        block is done) and the step's sets: committed, edited, deleted, split offsets, p."""
        L = len(cur)
        banned = logits.clone()
        banned[:, mask] = -float("inf")
        probs = logits.softmax(-1)                            # over the whole vocabulary; never the mask
        p, x0 = probs.masked_fill(banned == -float("inf"), -1.0).max(-1)
        x0, p = x0.tolist(), p.tolist()
        masked = [i for i in range(L) if cur[i] == mask and not self.prompt[i]]
        n_orig = sum(self.orig[i] for i in masked)
        if n_orig:
            need = 1 + len(masked) - n_orig
            high = [i for i in masked if p[i] > cfg.threshold]
            m2t = high if len(high) >= need else sorted(masked, key=lambda i: (-p[i], i))[:need]
        else:
            m2t = masked
        self.steps += 1
        if not n_orig:
            self.post += 1
        budget = cfg.max_post_steps          # force-finish (docs §3 4): the budget spent; budget 0: the step
        filled = not budget and n_orig and all(i in m2t for i in masked if self.orig[i])   # filling the last
        forced = (not n_orig and self.post >= budget) or filled or self.steps > L + budget  # original masks; the cap
        if forced:
            m2t = masked                                      # every mask of the block is written
            banned[:, delete] = banned[:, split] = -float("inf")
            best = banned.argmax(-1).tolist()
            x0 = [best[i] if x0[i] in (delete, split) else x0[i] for i in range(L)]
        t2t = [i for i in range(L) if cur[i] != mask and not self.prompt[i] and x0[i] != cur[i]
               and p[i] > cfg.edit_threshold]
        write = sorted(set(m2t) | set(t2t))
        if not write:
            self.live = False
            return None, (m2t, t2t, [], [], p)
        key = tuple(cur)
        if key in self.seen and not forced:
            changing = [i for i in write if x0[i] != cur[i]]
            if changing:
                at = min(changing, key=lambda i: (p[i], i))
                row = banned[at].clone()
                row[list(self.history.get(at, ()))] = -float("inf")
                x0[at] = int(row.argmax())
        self.seen.add(key)
        for i in write:
            self.history.setdefault(i, set()).add(x0[i])
        new = list(cur)
        for i in write:
            new[i] = x0[i]
        tokens, flags = [], []
        for i in range(L):
            if new[i] == delete:
                continue
            keep = [(mask, False), (cur[i], self.orig[i])] if new[i] == split else [(new[i], self.orig[i])]
            tokens += [t for t, _ in keep]
            flags += [f for _, f in keep]
        tokens, flags = tokens[:L] + [mask] * (L - len(tokens)), flags[:L] + [False] * (L - len(flags))
        self.orig = flags
        self.live = not forced
        deleted = [i for i in write if new[i] == delete]
        opened = [i for i in write if new[i] == split]
        return tokens, (m2t, t2t, deleted, opened, p)


class InDelBatch(Stepper):
    """One batch's InDel decoding; `events()` and `result()` as mask_loop.Batch."""

    def __init__(self, decoder, prompts: list[list[int]], cfg, gen_lens: list[int] | None = None):
        model = decoder.model
        if not model.attention.causal or model.logit_shift:
            raise UserError(f"indel: {decoder.name} is not a block-causal same-position family (LLaDA2.x)")
        if cfg.sub_block_len is not None or cfg.temperature:
            raise UserError("indel: greedy, whole blocks (unset sub_block_len and temperature)")
        self.delete, self.split = indel_ids(decoder)
        super().__init__(decoder, prompts, cfg, gen_lens)
        self.canvas = self.plan_canvas(causal=True)
        device = decoder.device
        self.start_clock()
        self.cache = model.new_cache(self.canvas.valid.to(device), block=cfg.block_len, keep_kv=True)
        self.forward = SpanForward.for_model(model, self.canvas.host.to(device), self.cache, widen=False)
        self.deletions = self.insertions = 0

    def events(self) -> Iterator[StepEvent | BlockEvent]:
        cfg, canvas, mask = self.cfg, self.canvas, self.decoder.specials.mask
        host, B, T, device = canvas.host, len(self.prompts), canvas.length, self.decoder.device
        starts = torch.tensor(canvas.starts)[:, None]
        stops = torch.tensor(self.decoder.specials.stops)

        def store(s: int, e: int, block: int) -> StepEvent:
            with torch.inference_mode():
                at, tokens, chosen = complete_block(self.forward, self.decoder.model, host, s, e, mask)
            self.nfe += 1
            return StepEvent(block, -1, self.nfe, (s, e), at - starts, tokens, chosen.double(), chosen)

        if canvas.prefill:
            yield store(0, canvas.prefill, 0)
        for block, (s, e) in enumerate(canvas.blocks):
            L = e - s
            rows = [RowBlock(host[r, s:e].tolist(), mask, canvas.starts[r] - s) if s < canvas.ends[r] else None
                    for r in range(B)]
            at = torch.arange(s, e)[None].expand(B, L)
            step, fresh = 0, True
            while any(r is not None and r.live for r in rows):
                span = span_for(cfg, step, s, e, T, causal=True)
                with torch.inference_mode():
                    logits = self.forward(span, at.to(device)).double().cpu()        # (B, L, V)
                flags = {k: torch.zeros(B, L, dtype=torch.bool) for k in ("committed", "edited", "deleted", "inserted")}
                conf = torch.zeros(B, L, dtype=torch.float64)
                fresh = True
                for r, state in enumerate(rows):
                    if state is None or not state.live:
                        continue
                    tokens, (m2t, t2t, deleted, opened, p) = state.step(host[r, s:e].tolist(), logits[r], cfg, mask,
                                                                         self.delete, self.split)
                    conf[r] = torch.tensor(p, dtype=torch.float64)
                    if tokens is None:
                        continue
                    fresh = False
                    for key, offsets in zip(flags, (m2t, t2t, deleted, opened)):
                        flags[key][r, offsets] = True
                    host[r, s:e] = torch.tensor(tokens)
                    self.committed, self.edits = self.committed + len(m2t), self.edits + len(t2t)
                    self.deletions, self.insertions = self.deletions + len(deleted), self.insertions + len(opened)
                self.forward.canvas[:, s:e] = host[:, s:e].to(device)
                self.nfe += 1
                self.stamp()
                yield StepEvent(block, step, self.nfe, span, at - starts, host[:, s:e].clone(), conf,
                                flags["committed"], edited=flags["edited"], deleted=flags["deleted"],
                                inserted=flags["inserted"], masks=host[:, s:e] == mask)
                step += 1
            self.blocks_done += 1
            first = max(s, canvas.starts[0])
            done = answer_ended(canvas, stops, mask)                 # finished blocks are final: safe to stop
            yield BlockEvent(block, first - canvas.starts[0], e - canvas.starts[0], host[:, first:e].clone(), done)
            if block == len(canvas.blocks) - 1 or (cfg.early_stop and bool(done.all())):
                break
            if not fresh:                                   # the block's last forward did not see it final
                yield store(s, e, block + 1)
