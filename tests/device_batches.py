"""The device step's trace, shared by tests/decode/test_device_step.py and test_frechet_rule.py: the prompt
lengths of a one-row and a left-padded batch (BATCHES, on and off a multiple of block_len 8), their
prompts cut from one chat prompt (prompts_of), a decode that builds the step with or without the device
step and records per step the committed positions and tokens (decode), and the check that two such
traces are the same commit for commit, with the same canvas, NFE, counts and ids (assert_same)."""

from __future__ import annotations

import torch

from fastdllm.decode import mask_loop
from fastdllm.decode.engine import Result, StepEvent, generate

# prompt lengths (in tokens) on and off a multiple of block_len 8: one row, and a left-padded batch
BATCHES = {"one": [16], "padded": [13, 8, 21]}


def prompts_of(lm, lengths):
    ids = lm.encode("Explain the block-wise KV cache in two sentences, please, and then say why.", chat=True)
    return [ids[-n:] for n in lengths]


def decode(lm, prompts, cfg, monkeypatch, *, full_block: bool, on_device: bool, gen_lens=None, holes=None):
    """Per step (block, step, span, committed positions, their tokens), and the Result. The
    forward's canvas is a copy of the host's (on CPU `.to(device)` would alias them), as on a GPU:
    the engine must keep both."""
    made = []

    def factory(cls, model, canvas, cache, widen=True):
        made.append(cls(model, canvas.clone(), cache, graphs=False, full_block=full_block, widen=widen,
                        device_step=on_device))
        return made[-1]

    monkeypatch.setattr(mask_loop.SpanForward, "for_model", classmethod(factory))
    events = list(generate(lm.decoder, prompts, cfg, gen_lens=gen_lens, holes=holes))
    steps = [(e.block, e.step, e.span, [p[c].tolist() for p, c in zip(e.positions, e.committed)],
              [t[c].tolist() for t, c in zip(e.tokens, e.committed)]) for e in events if isinstance(e, StepEvent)]
    assert isinstance(events[-1], Result)
    if holes is None and gen_lens is None:                              # the device canvas took every commit
        assert torch.equal(made[0].canvas[:, -events[-1].canvas.shape[1]:], events[-1].canvas)
    return steps, events[-1]


def assert_same(a, b):
    (steps_a, ra), (steps_b, rb) = a, b
    assert steps_a == steps_b                                            # commit order and tokens, step by step
    assert ra.canvas.tolist() == rb.canvas.tolist()
    assert (ra.nfe, ra.committed, ra.ids) == (rb.nfe, rb.committed, rb.ids)
