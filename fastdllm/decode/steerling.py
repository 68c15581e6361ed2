"""Steerling's decoder: `SteerlingGenerator.generate_full` (steerling 0.2.0, docs/specs/steerling.md 5).
Not a second engine: it yields the same StepEvent / BlockEvent / Result as mask_loop.Batch.

Canvas `prompt + gen_len masks` (length L + G exactly). Decoding blocks of `diff_block_size` start
at the prompt's end, while attention is block-causal on the absolute grid, so a decoding block
straddles two attention blocks when L is not a multiple. Per block, `steps / blocks` steps with
LLaDA's fixed quota; at each step the masked positions of the block are ranked by max softmax of
the processed fp32 logits (repetition penalty over the canvas's ids, EOS, mask and pad banned),
the quota's best are taken in that order and each is then sampled (entropy-adaptive temperature
and top-p, or temperature and top-p, or argmax), one draw per position from the row's generator.
Sampling `<|eot_id|>` (instruct) fills the rest of the row with EOS and ends it at once; a stop
token (`<|endofchunk|>` for the base model) ends it after its block.

Cache: `none` recomputes the whole canvas every step (the authors' forward). `prefix` is exact too:
positions after the block's last attention block are invisible to it, and the K/V of attention
blocks before the first changed token are final, so each step recomputes from the first attention
block holding a token changed since its K/V were written, up to the end of the attention block
holding the block's end. Same logits, same NFE."""

from __future__ import annotations

import math
from typing import Iterator

import torch

from ..errors import UserError
from .canvas import Canvas
from .config import DecodeConfig
from .decoder import Decoder
from .events import BlockEvent, Result, StepEvent
from .selection import block_schedule
from .stepper import Stepper


def refuse(decoder: Decoder, cfg: DecodeConfig, prompts, gen_lens, holes, constraints) -> None:
    """One-line errors for what generate_full does not do."""
    block = decoder.model.config.diff_block_size
    name = decoder.name
    for on, why in (
            (holes is not None, "cannot fill holes: its blocks follow the prompt"),
            (bool(constraints) and any(constraints), "structured output is not wired to its decoder"),
            (cfg.rule != "fixed" or cfg.confidence != "prob",
             "decodes by its authors' rule only: rule fixed, confidence prob (positions by max probability, "
             "tokens sampled after)"),
            (cfg.block_len != block, f"decodes blocks of its diff_block_size {block} (block_len {cfg.block_len})"),
            (cfg.cache not in ("none", "prefix"), f"cache {cfg.cache}: use prefix (exact) or none"),
            (cfg.mode != "diffusion" or cfg.credit or cfg.prophet or cfg.dpad_window or cfg.indel
             or cfg.edit_threshold is not None or cfg.sub_block_len is not None or cfg.block_align == "grid",
             "credit, prophet, dpad, editing, sub-blocks, grid alignment and other modes are not its authors' decoder"),
            (len({len(p) for p in prompts}) > 1, "decodes one prompt length per batch (its blocks start at the "
                                                  "prompt's end): send prompts of other lengths apart"),
            (gen_lens is not None and set(gen_lens) != {cfg.gen_len}, "gives every row gen_len tokens"),
            (len(prompts[0]) + cfg.gen_len > decoder.context_length,
             f"prompt {len(prompts[0])} + gen_len {cfg.gen_len} exceeds the context {decoder.context_length}")):
        if on:
            raise UserError(f"{name}: {why}")


def sample(z: torch.Tensor, cfg: DecodeConfig, generator: torch.Generator) -> int:
    """One token from the fp32 logits z (V,), as the authors' _sample_token."""
    if cfg.entropy_sampling:
        p = torch.softmax(z, -1)
        mass = torch.cumsum(torch.sort(p, descending=True).values, -1)
        kept = max(int((mass <= cfg.top_p).sum()) + 1, 2)
        entropy = float(-(p * torch.log(p + 1e-10)).sum())
        return top_p_draw(torch.softmax(z / (0.3 + 0.4 * min(1.0, entropy / math.log(kept))), -1), cfg.top_p, generator)
    if cfg.top_p > 0 and cfg.temperature > 0:
        return top_p_draw(torch.softmax(z / cfg.temperature, -1), cfg.top_p, generator)
    return int(torch.argmax(z))


def top_p_draw(p: torch.Tensor, top_p: float, generator: torch.Generator) -> int:
    """Keep the sorted tokens whose mass before them is <= top_p (the first always), renormalise, draw."""
    sorted_p, order = torch.sort(p, descending=True)
    keep = (torch.cumsum(sorted_p, -1) - sorted_p) <= top_p
    keep[0] = True
    kept = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    return int(order[torch.multinomial(kept / kept.sum(), 1, generator=generator)])


class SteerlingBatch(Stepper):
    """One batch's state (rows of one prompt length, each decoded as alone); `events()`, `result()`."""

    def __init__(self, decoder: Decoder, prompts: list[list[int]], cfg: DecodeConfig, gen_lens=None, holes=None,
                 constraints=None):
        if not prompts or any(len(p) == 0 for p in prompts):
            raise UserError("empty prompt: give at least one token of input")
        refuse(decoder, cfg, prompts, gen_lens, holes, constraints)
        super().__init__(decoder, prompts, cfg)                 # every row gen_len tokens
        model, specials = decoder.model, decoder.specials
        B, L, G, size = len(prompts), len(prompts[0]), cfg.gen_len, cfg.block_len
        host = torch.full((B, L + G), specials.mask, dtype=torch.long)
        host[:, :L] = torch.tensor(prompts)
        blocks = [(L + k * size, L + (k + 1) * size) for k in range(G // size)]
        self.canvas = Canvas(host, torch.ones_like(host, dtype=torch.bool), [L] * B, [L + G] * B, G, blocks, 0)
        self.start_clock()
        self.kv = model.new_kv(B, L + G)
        self.cache = _Bytes(sum(k.nbytes + v.nbytes for k, v in self.kv))
        self.kv_tokens = torch.full_like(host, -1)       # the tokens each slot's K/V were computed from
        self.generators = [torch.Generator(device="cpu").manual_seed(cfg.seed) for _ in prompts]
        self.eos = model.config.eos_token_id
        self.banned = torch.tensor([self.eos, specials.mask, specials.pad])
        self.ended = torch.zeros(B, dtype=torch.bool)    # EOT sampled or a stop token's block finished

    def _span(self, s: int, e: int) -> tuple[int, int]:
        """The canvas span a step of decoding block [s, e) recomputes (module docstring)."""
        T, grid = self.canvas.length, self.cfg.block_len
        if self.cfg.cache == "none":
            return 0, T
        changed = (self.canvas.host != self.kv_tokens).any(0).nonzero()
        first = int(changed[0]) if len(changed) else T
        return min(first, s) // grid * grid, min(T, -(-e // grid) * grid)

    def _choose(self, row: int, logits: torch.Tensor, s: int, quota: int):
        """The row's picks in the block [s, ...) from its logits (K, V) there: (offsets, tokens, conf)."""
        host, cfg = self.canvas.host, self.cfg
        masked = (host[row, s:s + logits.shape[0]] == self.decoder.specials.mask).nonzero()[:, 0]
        z = logits[masked].float()                                       # fp32, as the authors (also from fp64)
        if cfg.repetition_penalty != 1.0:
            seen = host[row].unique()
            seen = seen[(seen >= 0) & (seen < z.shape[-1])]
            values = z[:, seen]
            z[:, seen] = torch.where(values > 0, values / cfg.repetition_penalty, values * cfg.repetition_penalty)
        z[:, self.banned] = float("-inf")
        conf = torch.softmax(z, -1).max(-1).values
        picks = conf.topk(min(quota, len(masked))).indices if quota and len(masked) else masked[:0]
        return masked, z, conf, picks

    def events(self) -> Iterator[StepEvent | BlockEvent]:
        cfg, canvas, model, specials = self.cfg, self.canvas, self.decoder.model, self.decoder.specials
        host, device, B, L = canvas.host, self.decoder.device, len(self.prompts), canvas.starts[0]
        stops = torch.tensor([t for t in specials.stops if t != specials.eot] if cfg.early_stop else [], dtype=torch.long)
        size = cfg.block_len
        for block, (s, e) in enumerate(canvas.blocks):
            if bool(self.ended.all()):
                break
            schedule = block_schedule(torch.full((B,), size), cfg)[0].tolist()   # LLaDA's quota per step
            positions = torch.arange(s, e)[None, :].expand(B, -1) - L
            for step, quota in enumerate(schedule):
                if bool(self.ended.all()):
                    break
                a, b = self._span(s, e)
                with torch.inference_mode():
                    logits = model.span_logits(host[:, a:b].to(device), a, self.kv,
                                               torch.arange(s, e, device=device).expand(B, -1)).cpu()
                self.kv_tokens[:, a:b] = host[:, a:b]
                self.nfe += 1
                self.stamp()
                tokens, conf = logits.argmax(-1), torch.zeros(B, size, dtype=torch.float64)
                chosen = torch.zeros(B, size, dtype=torch.bool)
                for row in (~self.ended).nonzero()[:, 0].tolist():
                    masked, z, row_conf, picks = self._choose(row, logits[row], s, quota)
                    conf[row, masked] = row_conf.double()
                    for pick in picks.tolist():
                        offset = int(masked[pick])
                        token = sample(z[pick], cfg, self.generators[row])
                        host[row, s + offset] = tokens[row, offset] = token
                        chosen[row, offset] = True
                        self.committed += 1
                        if specials.eot is not None and token == specials.eot:
                            host[row, s + offset + 1:] = self.eos                # EOT: EOS everywhere after
                            self.ended[row] = True
                            break
                yield StepEvent(block, step, self.nfe, (a, b), positions, tokens, conf, chosen)
            self.blocks_done += 1
            self.ended |= torch.isin(host[:, L:e], stops).any(1)
            yield BlockEvent(block, s - L, e - L, host[:, s:e].clone(), self.ended.clone())

    def generated(self) -> torch.Tensor:
        return self.canvas.host[:, self.canvas.starts[0]:]

    def result(self) -> Result:
        """The authors' output walk: skip masks and EOS, cut at the first stop token or EOT."""
        specials, region = self.decoder.specials, self.generated()
        ends = set(specials.stops) - {self.eos} if self.cfg.early_stop else {specials.eot} - {None}
        answers = []
        for row in region.tolist():
            answer = []
            for t in row:
                if t in ends:
                    break
                if t not in (specials.mask, self.eos):
                    answer.append(t)
            answers.append(answer)
        return self.finish(answers, region)


class _Bytes:
    def __init__(self, nbytes: int):
        self.nbytes = nbytes
