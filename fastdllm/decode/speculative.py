"""Nemotron-Labs Diffusion's causal decoders (docs/specs/nemotron-diffusion.md §4-5), with the events and
result of mask_loop.Batch:

- mode ar (`ar_generate`): one token per causal forward, its K/V kept;
- mode self_spec (`linear_spec_generate`, one prompt at a time): each round drafts a block
  `[seed, masks]` bidirectionally against the cache (with the checkpoint's linear_spec_lora on
  o_proj where it ships one), verifies it with one causal forward, and keeps the longest prefix of
  drafts the causal argmax agrees with, plus the causal token after it (the bonus, the next seed).
  Drafts: rule threshold = C's threshold > 0 (commit the masks at or above it, at least the best,
  until none is left); any other rule = C's default threshold 0 (one draft forward fills every mask).

AR is the same loop with blocks of one token and no draft. Each round is a block (BlockEvent over
the tokens it accepted); the draft forwards are steps that commit nothing, the verification is the
step that commits. A row ends at its first stop token; the answer is cut at gen_len (C's
self-speculation may run up to block_len - 1 past it)."""

from __future__ import annotations

from typing import Iterator

import torch

from ..errors import UserError
from .config import DecodeConfig
from .decoder import Decoder
from .events import BlockEvent, StepEvent
from .selection import predict, select
from .stepper import Stepper


class SpeculativeBatch(Stepper):
    def __init__(self, decoder: Decoder, prompts: list[list[int]], cfg: DecodeConfig, gen_lens: list[int] | None = None):
        if cfg.mode == "self_spec" and len(prompts) > 1:
            raise UserError(f"mode self_spec: {decoder.name} verifies one prompt at a time, as its authors' "
                            f"linear_spec_generate (use batch size 1)")
        super().__init__(decoder, prompts, cfg, gen_lens)
        self.L = cfg.block_len if cfg.mode == "self_spec" else 1
        canvas = self.plan_canvas()
        extra = torch.full((len(prompts), self.L), decoder.specials.mask)   # a last round's block may overhang
        canvas.host, canvas.valid = torch.cat([canvas.host, extra], 1), torch.cat([canvas.valid, extra >= 0], 1)
        self.canvas = canvas
        self.start_clock()
        self.cache = decoder.model.new_cache(canvas.valid.to(decoder.device))
        self.generator = torch.Generator(device=decoder.device).manual_seed(cfg.seed)

    def _predict(self, logits):
        return predict(logits, temperature=self.cfg.temperature, measure=self.cfg.confidence,
                       banned=(self.decoder.specials.mask,), generator=self.generator)

    def events(self) -> Iterator[StepEvent | BlockEvent]:
        cfg, canvas, model, L = self.cfg, self.canvas, self.decoder.model, self.L
        host, device, specials = canvas.host, self.decoder.device, self.decoder.specials
        stops, mask, B = torch.tensor(specials.stops), specials.mask, len(self.prompts)
        start, ends = canvas.starts[0], torch.tensor(canvas.ends)
        with torch.inference_mode():
            seed, conf = self._predict(model.encode(host[:, :start].to(device), 0, self.cache)[:, None])
        live = torch.ones(B, dtype=torch.bool)
        host[:, start] = seed[:, 0].cpu()
        self.count(B)
        yield StepEvent(0, -1, self.nfe, (0, start), torch.zeros(B, 1, dtype=torch.long), seed.cpu(),
                        conf.cpu().double(), live[:, None].clone())
        c, rnd = start, 0                          # c: the slot of the seed, the cache's length
        live &= ~torch.isin(host[:, c], stops) & (c + 1 < ends)
        while bool(live.any()):
            block = host[:, c:c + L].clone()
            block[:, 1:] = mask
            positions = torch.arange(c, c + L)[None, :].expand(B, L) - start
            step = 0
            while bool((block == mask).any()):      # drafts (self_spec): nothing is committed yet
                with torch.inference_mode():
                    tokens, conf = self._predict(model.denoise(block.to(device), c, self.cache, adapter=True))
                    masked = (block == mask).to(device)
                    chosen = select(conf, masked, cfg) if cfg.rule == "threshold" else masked
                tokens, chosen = tokens.cpu(), chosen.cpu()
                block = torch.where(chosen, tokens, block)
                self.count(0)
                yield StepEvent(rnd, step, self.nfe, (c, c + L), positions, tokens, conf.cpu().double(),
                                torch.zeros_like(chosen))
                step += 1
            with torch.inference_mode():
                ar, conf = self._predict(model.encode_all(block.to(device), c, self.cache))
            ar = ar.cpu()
            agree = (ar[:, :L - 1] == block[:, 1:]).long().cumprod(1).sum(1)    # (B,) drafts kept
            accepted = agree + 1                                               # and the bonus token
            keep = torch.arange(L)[None, :] < accepted[:, None]
            write = keep & live[:, None] & (torch.arange(c + 1, c + 1 + L)[None, :] < ends[:, None])
            host[:, c + 1:c + 1 + L] = torch.where(write, ar, host[:, c + 1:c + 1 + L])
            self.count(int(write.sum()))
            yield StepEvent(rnd, step, self.nfe, (c, c + L), positions + 1, ar, conf.cpu().double(), write)
            a = int(accepted[live].max()) if B > 1 else int(accepted[0])   # AR: every row accepts 1
            self.blocks_done += 1
            yield BlockEvent(rnd, c + 1 - start, c + 1 + a - start, host[:, c + 1:c + 1 + a].clone(),
                             ~live | torch.isin(host[:, c + 1:c + 1 + a], stops).any(1))
            live &= ~(torch.isin(ar, stops) & write).any(1)
            c, rnd = c + a, rnd + 1
            live &= c + 1 < ends
