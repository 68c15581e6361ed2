"""Engine behaviour: batching, NFE accounting, early stop, events, validation."""

from __future__ import annotations

import pytest
import torch

from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import BlockEvent, Result, StepEvent, generate, run
from fastdllm.errors import UserError

PROMPTS = ["Hi.", "Explain the block-wise KV cache in two sentences, please.", "What is 2 + 2?"]


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_batch_rows_equal_single_runs(family, cache, request):
    lm = request.getfixturevalue(f"{family}64")
    prompts = [lm.encode(p, chat=True) for p in PROMPTS]
    assert len({len(p) for p in prompts}) == 3                     # three different lengths
    cfg = DecodeConfig(gen_len=24, block_len=8, cache=cache, rule="threshold", threshold=0.7, early_stop=False)
    batch = run(lm.decoder, prompts, cfg)
    for row, prompt in enumerate(prompts):
        alone = run(lm.decoder, [prompt], cfg)
        assert batch.canvas[row].tolist() == alone.canvas[0].tolist()


def test_vanilla_takes_gen_len_forwards_and_threshold_never_more(llada64):
    prompt = llada64.encode("Count to ten.", chat=True)
    vanilla = run(llada64.decoder, [prompt], DecodeConfig(gen_len=32, block_len=8, cache="none", rule="fixed", early_stop=False))
    assert vanilla.nfe == 32 and vanilla.committed == 32
    assert vanilla.committed_per_forward == 1.0
    assert vanilla.tokens_per_forward == vanilla.generated_tokens / 32            # answer tokens only
    for cache in ("none", "prefix", "dual"):
        for tau in (0.5, 0.9, 1.0):
            fast = run(llada64.decoder, [prompt], DecodeConfig(gen_len=32, block_len=8, cache=cache, threshold=tau, early_stop=False))
            assert fast.nfe <= vanilla.nfe
            assert fast.committed == 32


def test_fixed_rule_nfe_equals_steps(llada64):
    prompt = llada64.encode("Count to ten.", chat=True)
    r = run(llada64.decoder, [prompt], DecodeConfig(gen_len=32, block_len=8, rule="fixed", steps=8, early_stop=False))
    assert r.nfe == 8 and r.committed_per_forward == 4.0


def test_events_cover_every_step_and_block(llada64):
    prompt = llada64.encode("Count to ten.", chat=True)
    events = list(generate(llada64.decoder, [prompt], DecodeConfig(gen_len=32, block_len=8, early_stop=False)))
    steps = [e for e in events if isinstance(e, StepEvent)]
    blocks = [e for e in events if isinstance(e, BlockEvent)]
    result = events[-1]
    assert isinstance(result, Result)
    assert [s.nfe for s in steps] == list(range(1, result.nfe + 1))
    assert [(b.start, b.end) for b in blocks] == [(0, 8), (8, 16), (16, 24), (24, 32)]
    assert sum(int(s.committed.sum()) for s in steps) == 32
    first_of_block = [s for s in steps if s.step == 0]
    assert len(first_of_block) == 4 and all(s.span[0] == 0 for s in first_of_block)  # fused refresh
    assert all(s.span == (len(prompt) + 8 * s.block, len(prompt) + 8 * s.block + 8)
               for s in steps if s.step > 0)                                           # dual: block only
    assert torch.equal(torch.cat([b.tokens for b in blocks], 1), result.canvas)


def test_refresh_every_adds_full_forwards(llada64):
    prompt = llada64.encode("Count to ten.", chat=True)
    cfg = DecodeConfig(gen_len=16, block_len=8, rule="fixed", refresh_every=2, early_stop=False)
    spans = [e.span for e in generate(llada64.decoder, [prompt], cfg) if isinstance(e, StepEvent)]
    full = [i % 8 for i, span in enumerate(spans) if span[0] == 0]
    assert full == [0, 2, 4, 6, 0, 2, 4, 6]


def test_early_stop_and_answer_counting(llada64):
    """Force the answer to end: make the end-of-turn id the only reachable prediction after the
    first block by running with a stop id the model predicts everywhere."""
    prompt = llada64.encode("Count to ten.", chat=True)
    cfg = DecodeConfig(gen_len=32, block_len=8, rule="fixed", early_stop=False)
    full = run(llada64.decoder, [prompt], cfg)
    first_block = full.canvas[0, :8].tolist()
    stop_token = first_block[3]
    specials = llada64.specials
    try:  # declare a token of the first block an end token, as an EOS would be
        llada64.specials = type(specials)(mask=specials.mask, pad=specials.pad, stops=(stop_token,), eot=None)
        stopped = run(llada64.decoder, [prompt], DecodeConfig(gen_len=32, block_len=8, rule="fixed"))
        kept = run(llada64.decoder, [prompt], cfg)
    finally:
        llada64.specials = specials
    cut = first_block.index(stop_token)
    assert stopped.early_stopped and stopped.blocks_decoded == 1 and stopped.nfe == 8
    assert stopped.ids[0] == first_block[:cut] and stopped.generated_tokens == cut
    assert not kept.early_stopped and kept.nfe == 32 and kept.ids[0] == first_block[:cut]
    assert (stopped.canvas[0, 8:] == specials.mask).all()


def test_dream_logits_are_shifted(dream64):
    """Position p is predicted from the hidden state at p - 1: the span forward's logits for p
    equal the plain forward's raw logits at p - 1, and differ from those at p."""
    ids = torch.tensor([dream64.encode("abc def", chat=False) + [dream64.specials.mask] * 6])
    T = ids.shape[1]
    raw = dream64.model(ids).logits
    cache = dream64.model.new_cache(torch.ones_like(ids, dtype=torch.bool))
    p = torch.arange(T - 6, T)[None]
    out = dream64.model.forward_span(ids, 0, T, cache, p)
    assert torch.allclose(out, raw[:, T - 7:T - 1], atol=1e-12)
    assert not torch.allclose(out, raw[:, T - 6:T], atol=1e-3)
    # a block-only span still gets position s from s - 1 (the span is widened inside the adapter)
    dual = dream64.model.forward_span(ids, T - 6, T, cache, p)
    assert torch.allclose(dual, raw[:, T - 7:T - 1], atol=1e-9)


def test_sampling_is_seeded(llada64):
    prompt = llada64.encode("Count to ten.", chat=True)
    cfg = DecodeConfig(gen_len=16, block_len=8, temperature=1.0, seed=7, early_stop=False)
    a, b = run(llada64.decoder, [prompt], cfg), run(llada64.decoder, [prompt], cfg)
    c = run(llada64.decoder, [prompt], DecodeConfig.from_dict({"seed": 8}, cfg))
    assert a.canvas.tolist() == b.canvas.tolist() != c.canvas.tolist()


def test_length_validation(llada64):
    with pytest.raises(UserError, match="empty prompt"):
        run(llada64.decoder, [[]], DecodeConfig(gen_len=8, block_len=8))
    with pytest.raises(UserError, match="exceeds the model's context of 4096"):
        run(llada64.decoder, [[10] * 4000], DecodeConfig(gen_len=128, block_len=32))
