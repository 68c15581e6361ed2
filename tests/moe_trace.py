"""The mixture-of-experts trace, shared by tests/models/test_moe.py, test_llada2_2.py and
test_sdar_moe.py: a model's full-sequence float64 logits under the family's attention with every router's output (our_logits), and a decode that
records per row the (position, token) pairs committed at each denoising step, the store passes, the
Result and the step events (decode). The prompts are helpers.prompt_of's."""

from __future__ import annotations

import torch

from fastdllm.decode.engine import run
from fastdllm.decode.events import StepEvent


def our_logits(lm, ids: list[int]) -> tuple[torch.Tensor, list]:
    """Full-sequence float64 logits (T, V) under the family's attention, and every router's output."""
    routes = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: routes.append(out))
             for name, m in lm.model.named_modules() if name.endswith("mlp.gate")]
    x = torch.tensor([ids])
    cache = lm.model.new_cache(torch.ones_like(x, dtype=torch.bool), keep_kv=False, block=lm.model.attention.block)
    with torch.no_grad():
        logits = lm.model.head(lm.model.hidden_states(x, 0, cache))[0]
    for h in hooks:
        h.remove()
    return logits, routes


def decode(lm, prompts, cfg):
    """Per row the denoising steps [(position, token) committed], the store passes, the Result."""
    steps, stores, events = [[] for _ in prompts], 0, []
    result = run(lm.decoder, prompts, cfg, on_event=lambda e: events.append(e) if isinstance(e, StepEvent) else None)
    for e in events:
        stores += e.step < 0
        for row, prompt in enumerate(prompts):
            pairs = sorted((int(p) + len(prompt), int(t)) for p, t, c in
                           zip(e.positions[row], e.tokens[row], e.committed[row]) if c)
            if e.step >= 0 and pairs:
                steps[row].append(pairs)
            assert e.step >= 0 or not pairs                    # no logit shift: store passes commit nothing
    return steps, stores, result, events
