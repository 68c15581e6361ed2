"""The CUDA-graph path's CPU-visible part: graph steps ask for logits at every position of the
active block (committed positions as never-selected filler). That must not change a single
decision. Where the decision runs on the device too (device_step.py) the graph holds the whole step:
tests/decode/test_device_step.py. The graph replay itself needs a GPU: benchmarks/gpu_check.py compares it with
this path."""

from __future__ import annotations

import pytest

from fastdllm.decode import mask_loop
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import StepEvent, generate
from fastdllm.decode.graphs import SpanForward, graphs_possible

PROMPTS = ["Hi.", "Explain the block-wise KV cache in two sentences, please."]


def _steps(lm, prompts, cfg):
    events = list(generate(lm.decoder, prompts, cfg))
    steps = [(e.block, e.step, e.span, e.positions[e.committed].tolist(), e.tokens[e.committed].tolist())
             for e in events if isinstance(e, StepEvent)]
    widths = {e.positions.shape[1] for e in events if isinstance(e, StepEvent)}
    return steps, events[-1], widths


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache,rule", [("none", "fixed"), ("prefix", "threshold"), ("dual", "threshold"),
                                        ("dual", "factor"), ("dual", "fixed")])
def test_full_block_candidates_change_nothing(family, cache, rule, request, monkeypatch):
    lm = request.getfixturevalue(f"{family}64")                    # fp64
    prompts = [lm.encode(p, chat=True) for p in PROMPTS]
    cfg = DecodeConfig(gen_len=24, block_len=8, cache=cache, rule=rule, threshold=0.7, steps=12 if rule == "fixed" else None,
                       early_stop=False)
    default_steps, default, default_widths = _steps(lm, prompts, cfg)
    assert default_widths != {8}                                    # normally only the masked positions
    monkeypatch.setattr(mask_loop.SpanForward, "for_model",
                        classmethod(lambda cls, model, canvas, cache, widen=True: cls(model, canvas, cache, graphs=False,
                                                                                  full_block=True, widen=widen)))
    padded_steps, padded, padded_widths = _steps(lm, prompts, cfg)
    assert padded_widths == {8}                                     # every position of the block
    assert padded_steps == default_steps                            # same commits at every step
    assert padded.canvas.tolist() == default.canvas.tolist() and padded.nfe == default.nfe
    assert padded.committed == default.committed


def test_no_graphs_on_cpu_or_when_switched_off(llada64, monkeypatch):
    assert not graphs_possible(llada64.model)                        # CPU weights
    forward = SpanForward.for_model(llada64.model, None, None)
    assert not forward.graphs and not forward.full_block and not forward.device_step   # today's step on CPU
    assert SpanForward(llada64.model, None, None, graphs=True, full_block=False).device_step   # the whole step, graphed
    monkeypatch.setenv("FASTDLLM_CUDA_GRAPHS", "0")
    assert not graphs_possible(llada64.model)
