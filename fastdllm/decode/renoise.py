"""The renoising sampler: DiffusionGemma's decoder, as transformers' `generate` runs it
(docs/specs/diffusion-gemma.md §5). Not a second engine: it plans the canvas, yields the same StepEvent /
BlockEvent / Result as mask_loop.Batch, and chooses with the rules table (rule `eb_sampler`).

Canvas after canvas (blocks of block_len after the prompt): the encoder has written the K/V of
everything before; the canvas starts as uniform random tokens; each step the decoder (self-
conditioned on the previous step's scaled logits) gives logits, scaled by a temperature falling
from t_max to t_min; every position is sampled; the lowest-entropy ones the rule accepts keep their
sample and the rest are renoised (fresh uniform tokens). A canvas ends when its argmax has been
stable for `stability_steps` steps and its mean entropy is below `confidence_stop`, or after
`denoise_steps` steps; its last argmax is committed and encoded. Nothing is ever "unmasked": a
step's committed flags are its accepted positions, which the next step may renoise again.

Random draws are transformers' (torch.randint for canvases and renoising, torch.multinomial on fp32
probabilities), in its order, from one generator per row seeded with `seed`: a row decodes the
same alone or in a batch, and batch 1 draws exactly what transformers draws after
torch.manual_seed(seed) on the same device. A row that has stopped draws nothing more."""

from __future__ import annotations

from typing import Iterator

import torch

from ..errors import UserError
from .canvas import answer_ended
from .config import DecodeConfig
from .decoder import Decoder
from .events import BlockEvent, Result, StepEvent
from .rules import RULES
from .selection import select
from .stepper import Stepper


class RenoiseBatch(Stepper):
    """One batch's renoising state; `events()` and `result()` as mask_loop.Batch."""

    def __init__(self, decoder: Decoder, prompts: list[list[int]], cfg: DecodeConfig, gen_lens: list[int] | None = None,
                 generators: list[torch.Generator] | None = None):
        """`generators`: each row's random stream, to continue (the server re-plans batches at
        canvas boundaries); default, new ones seeded with cfg.seed."""
        if not RULES[cfg.rule].renoise:
            raise UserError(f"{decoder.name} resamples its whole canvas every step: its rule is eb_sampler "
                            f"(got '{cfg.rule}')")
        super().__init__(decoder, prompts, cfg, gen_lens)
        model = decoder.model
        self.canvas = self.plan_canvas()
        device = decoder.device
        self.start_clock()
        self.cache = model.new_cache(self.canvas.valid.to(device))
        self.generators = generators or [row_generator(device, cfg.seed) for _ in prompts]
        self.vocab = model.config.vocab_size
        self.steps: list[list[int]] = [[] for _ in prompts]      # per row: denoising steps of each canvas

    def events(self) -> Iterator[StepEvent | BlockEvent]:
        cfg, canvas, model = self.cfg, self.canvas, self.decoder.model
        host, device, specials = canvas.host, self.decoder.device, self.decoder.specials
        stops = torch.tensor(specials.stops)
        starts = torch.tensor(canvas.starts)[:, None]
        with torch.inference_mode():
            model.encode(host[:, :canvas.blocks[0][0]].to(device), 0, self.cache)
        self.nfe += 1

        def alive(s: int) -> list[bool]:
            """The rows that decode the canvas at s: not past their length, nor (early_stop, as
            transformers always does) after the canvas holding their stop id."""
            ended = answer_ended(canvas, stops, specials.mask) if cfg.early_stop else torch.zeros(len(self.prompts))
            return [not bool(ended[r]) and s < canvas.ends[r] for r in range(len(self.prompts))]

        for block, (s, e) in enumerate(canvas.blocks):
            live = alive(s)
            argmax, accepted_steps = yield from self._denoise(block, s, e, live, starts)
            for r, decoded in enumerate(live):
                if decoded:
                    host[r, s:e] = argmax[r].cpu()
                    self.steps[r].append(accepted_steps[r])
            self.committed += sum(live) * (e - s)
            self.blocks_done += 1
            first = canvas.starts[0]
            done = answer_ended(canvas, stops, specials.mask)
            yield BlockEvent(block, s - first, e - first, host[:, s:e].clone(), done)
            if block == len(canvas.blocks) - 1 or not any(alive(e)):
                break
            with torch.inference_mode():
                model.encode(host[:, s:e].to(device), s, self.cache)           # the committed canvas
            self.nfe += 1

    def _denoise(self, block: int, s: int, e: int, live: list[bool], starts: torch.Tensor):
        """One canvas's steps (a generator of StepEvents); returns its argmax canvas (B, C) and each
        row's step count."""
        cfg, model, device = self.cfg, self.decoder.model, self.decoder.device
        B, C = len(self.prompts), e - s
        x = torch.zeros(B, C, dtype=torch.long, device=device)
        for r in _rows(live):
            x[r] = self._uniform(r, C)
        argmax, previous = x.clone(), None
        active = torch.tensor(live, device=device)                           # (B,) still denoising
        history = torch.full((cfg.stability_steps, B, C), -1, dtype=torch.long, device=device)
        steps = [0] * B
        positions = torch.arange(s, e)[None, :].expand(B, C) - starts
        everything = torch.ones(B, C, dtype=torch.bool, device=device)
        for left in range(cfg.denoise_steps, 0, -1):                         # steps remaining, N .. 1
            with torch.inference_mode():
                logits = model.denoise(x, s, self.cache, previous) / _temperature(cfg, left)   # (B, C, V) fp32
                probs = logits.softmax(-1, dtype=torch.float32)
                entropy = torch.distributions.Categorical(logits=logits).entropy()    # (B, C)
                accepted = select(-entropy, everything, cfg)
                rows = _rows(active.tolist())
                # a stopped row draws nothing and keeps its canvas and argmax (its forward is discarded)
                for r in rows:
                    sample = torch.multinomial(probs[r], 1, generator=self.generators[r])[:, 0]
                    x[r] = torch.where(accepted[r], sample, self._uniform(r, C))
                new_argmax = torch.where(active[:, None], logits.argmax(-1), argmax)
                stable = (history == new_argmax[None]).all(-1).all(0) if cfg.stability_steps else torch.ones_like(active)
                history = torch.cat([history[1:], new_argmax[None]]) if cfg.stability_steps else history
                stopped = stable & (entropy.mean(-1) < cfg.confidence_stop)
            self.nfe += 1
            for r in rows:
                steps[r] += 1
            self.stamp()
            yield StepEvent(block, cfg.denoise_steps - left, self.nfe, (s, e), positions, x.clone().cpu(),
                            (-entropy).double().cpu(), (accepted & active[:, None]).cpu(), renoised=True)
            argmax, previous = new_argmax, logits.to(model.embed.weight.dtype)
            active = active & ~stopped
            if not bool(active.any()):
                break
        return argmax, steps

    def _uniform(self, row: int, n: int) -> torch.Tensor:
        return torch.randint(0, self.vocab, (n,), generator=self.generators[row], device=self.decoder.device)

    def result(self) -> Result:
        return super().result(steps=self.steps)


def row_generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _temperature(cfg: DecodeConfig, left: int) -> torch.Tensor:
    """t_min + (t_max - t_min) * left / N, in fp32 as transformers computes it (a float64 schedule
    samples differently in the last bits)."""
    return cfg.t_min + (cfg.t_max - cfg.t_min) * (torch.tensor(left, dtype=torch.int32) / cfg.denoise_steps)


def _rows(flags: list[bool]) -> list[int]:
    return [r for r, f in enumerate(flags) if f]
