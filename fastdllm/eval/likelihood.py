"""Log-likelihood of a continuation under a masked diffusion model: the Monte Carlo estimate of
LLaDA's own evaluation (ML-GSAI/LLaDA, eval_llada.py), written from its definition.

For a context c and a continuation x of L tokens, `mc_num` samples in batches of `mc_batch` rows
(mc_num a multiple of mc_batch). Per batch of b rows, drawn from one torch.Generator seeded with
`seed` once per `score` call, in this order:

    k ~ uniform{1..L}                                        torch.randint(1, L + 1, ())
    n_i = ((round(k + i * L / b) - 1) mod L) + 1, i < b      masked counts, stratified over 1..L
    row i: a random permutation of the L positions           torch.randperm(L), i = 0..b-1
           masks its first n_i positions

and the whole canvas (c, noisy x) goes through the model once. The batch's value is
sum_i sum_{masked j} -log p(x_j | noisy row i) / (n_i / L) / b; the estimate is minus the mean over
batches (a lower bound on log p(x | c) in expectation, as the paper's).

`is_greedy` (lm-eval's second value) is LLaDA's check: from c and L masks, commit one token per
forward, the most confident argmax, no cache; greedy when the result is x. It costs L forwards;
`check_greedy=False` skips it (then it is False), which multiple-choice tasks never read.
"""

from __future__ import annotations

import torch

from ..decode.config import DecodeConfig
from ..decode.engine import run
from ..errors import UserError


class Likelihood:
    def __init__(self, lm, *, mc_num: int = 128, mc_batch: int = 32, seed: int = 0, check_greedy: bool = True):
        if mc_num < 1 or mc_batch < 1 or mc_num % mc_batch:
            raise UserError(f"mc_num {mc_num} must be a positive multiple of mc_batch {mc_batch}")
        self.lm, self.mc_num, self.mc_batch, self.seed, self.check_greedy = lm, mc_num, mc_batch, seed, check_greedy
        self.forwards = 0                       # model forwards so far (a batch of mc_batch rows counts once)

    def score(self, context: list[int], target: list[int]) -> tuple[float, bool]:
        lm = self.lm
        if not lm.model.attention.bidirectional:
            raise UserError(f"{lm.path.name} has no Monte Carlo likelihood here: its attention is causal between "
                            f"blocks; run generation tasks (generate_until) with it")
        if not target:
            raise UserError("an empty continuation has no likelihood to estimate")
        if not context and lm.model.logit_shift:
            raise UserError(f"{lm.path.name} predicts each token from the one before it: an empty context "
                            f"leaves the first token without a prediction")
        if len(context) + len(target) > lm.context_length:
            raise UserError(f"context and continuation ({len(context) + len(target)} tokens) exceed the model's "
                            f"context of {lm.context_length}")
        estimate = self.estimate(context, target)
        return estimate, self.check_greedy and self.greedy(context, target)

    @torch.no_grad()
    def estimate(self, context: list[int], target: list[int]) -> float:
        model, mask = self.lm.model, self.lm.specials.mask
        device = model.input_device
        generator = torch.Generator().manual_seed(self.seed)
        L, b, C = len(target), self.mc_batch, len(context)
        seq = torch.tensor(context + target)
        positions = torch.arange(C, C + L)[None, :].expand(b, L).to(device)
        values = []
        for _ in range(self.mc_num // b):
            k = int(torch.randint(1, L + 1, (), generator=generator))
            counts = torch.round(torch.linspace(float(k), k + (b - 1) * (L / b), b)).long()
            counts = (counts - 1) % L + 1                                          # (b,) in 1..L
            masked = torch.zeros(b, L, dtype=torch.bool)
            for i in range(b):
                masked[i, torch.randperm(L, generator=generator)[:counts[i]]] = True
            noisy = seq.repeat(b, 1)
            noisy[:, C:][masked] = mask
            canvas = noisy.to(device)
            cache = model.new_cache(torch.ones_like(canvas, dtype=torch.bool), keep_kv=False)
            logits = model.forward_span(canvas, 0, canvas.shape[1], cache, positions).double()   # (b, L, V)
            nll = -torch.log_softmax(logits, -1).gather(-1, seq[C:].to(device).expand(b, L)[..., None])[..., 0]
            weighted = (nll.cpu() * masked).sum(1) / (counts.double() / L)
            values.append(float(weighted.sum() / b))
            self.forwards += 1
        return -sum(values) / len(values)

    def greedy(self, context: list[int], target: list[int]) -> bool:
        L = len(target)
        cfg = DecodeConfig(gen_len=L, block_len=L, rule="fixed", steps=L, cache="none", early_stop=False)
        result = run(self.lm.decoder, [context], cfg)
        self.forwards += result.nfe
        return result.canvas[0, :L].tolist() == target
