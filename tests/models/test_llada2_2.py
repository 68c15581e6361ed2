"""LLaDA2.2's block routing (docs/specs/llada2-2.md §2) against the independent float64 transcription in
tests/references/reference_moe.py (`llada2_block_route`): logits, every token's experts and weights, and every
block's kept experts; then decoding, which must stay the checkpoint's generate (and its editing
decoder) under every cache mode the LLaDA2 profiles use, prompts on and off the block grid, and a
batch must decode each row as alone."""

from __future__ import annotations

import pytest
import reference_editing as edit_ref
import reference_moe as ref
import torch
from helpers import prompt_of
from moe_trace import decode, our_logits

from fastdllm.checkpoints import loading
from fastdllm.testing.tiny_moe import write_llada2_2
from fastdllm.decode.config import DecodeConfig
from fastdllm.errors import UserError

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]

CAPACITY = 4          # of the fixture's 8 experts; top-k 3


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_llada2_2(tmp_path_factory.mktemp("ckpt") / "llada2.2", expert_capacity=CAPACITY)
    lm = loading.load(path, dtype="fp64")
    ref.BANNED[:] = [lm.specials.mask]                     # fastdllm never predicts the mask id
    yield lm, ref.NaiveLLaDA2(path)
    ref.BANNED[:] = []


def kept_experts(lm, ids):
    """Our full forward's kept experts: [{block: sorted experts}] per MoE layer, block = position // 32."""
    kept = []
    hooks = [m.register_forward_hook(lambda mod, _i, _o: kept.append(mod.kept))
             for name, m in lm.model.named_modules() if name.endswith("mlp.gate")]
    our_logits(lm, ids)
    for h in hooks:
        h.remove()
    return [{int(b) - 1: e.tolist() for b, e in zip(*layer)} for layer in kept]


@pytest.mark.parametrize("length", [45, 64, 20, 97])
def test_logits_routes_and_kept_experts_equal_the_reference(model, length):
    lm, naive = model
    ids = prompt_of(length, seed=length)
    logits, routes = our_logits(lm, ids)
    expected = naive.forward(ids, block_length=32)
    assert torch.allclose(logits, expected, rtol=0, atol=1e-10)
    assert len(routes) == len(naive.routes) == 2
    for (weights, experts), route in zip(routes, naive.routes):
        assert experts.tolist() == [list(e) for e in route.experts]
        assert torch.allclose(weights, torch.tensor(route.weights, dtype=torch.float64), rtol=0, atol=1e-12)
    ours = kept_experts(lm, ids)
    assert ours == [naive.kept[i] for i in sorted(naive.kept)]
    assert len(ours[0]) == -(-length // 32)                    # one set per block, a partial last one too
    for layer, route in zip(ours, naive.routes):               # a token's experts lie in its block's set
        for t, experts in enumerate(route.experts):
            assert set(experts) <= set(layer[t // 32])


def test_block_routing_changes_the_routes(model):
    """The fixture makes the capacity bite: some token's plain top-k (the LLaDA2.0/2.1 router) leaves
    its block's kept set, and the logits differ from the same weights routed without it."""
    lm, naive = model
    ids = prompt_of(64, seed=3)
    routed = naive.forward(ids, block_length=32)
    kept = {i: {b: set(v) for b, v in k.items()} for i, k in naive.kept.items()}
    with_capacity = dict(naive.cfg)
    naive.cfg = {k: v for k, v in with_capacity.items() if k != "expert_capacity"}
    try:
        free = naive.forward(ids, block_length=32)
        outside = sum(not set(experts) <= kept[route.layer][t // 32]
                      for route in naive.routes for t, experts in enumerate(route.experts))
    finally:
        naive.cfg = with_capacity
    assert outside > 0
    assert not torch.allclose(free, routed, atol=1e-6)


@pytest.mark.parametrize("length, threshold", [(5, 0.7), (32, 0.95), (33, 0.7), (63, 0.7)])
def test_decodes_as_its_generate_under_every_cache_mode(model, length, threshold):
    """The checkpoint's generate (tests/references/reference_moe.llada2_generate, no cache: every forward runs
    the whole window, so every block is routed whole) and ours with prefix, none and dual caches."""
    lm, naive = model
    prompt = prompt_of(length, seed=length)
    trace = ref.llada2_generate(naive, prompt, mask_id=lm.specials.mask, eos_id=lm.specials.stops[0],
                                gen_length=32, steps=32, threshold=threshold)
    for cache in ("prefix", "none", "dual"):
        cfg = DecodeConfig(gen_len=32, block_len=32, rule="dynamic", threshold=threshold, steps=32, cache=cache,
                           early_stop=False)
        steps, stores, result, _ = decode(lm, [prompt], cfg)
        assert steps[0] == [pairs for _, pairs in trace.steps if pairs], cache
        assert result.canvas[0].tolist() == trace.canvas[length:]
        assert result.nfe == trace.nfe + stores


@pytest.mark.parametrize("length, threshold, edit", [(5, 0.5, 0.0), (40, 0.7, 0.5)])
def test_editing_decodes_as_its_generate(model, length, threshold, edit):
    """LLaDA2.1's editing decoder (the 2.2 card's Speed mode settings) over block-routed forwards."""
    lm, naive = model
    prompt = prompt_of(length, seed=length)
    trace = edit_ref.editing_generate(naive, prompt, mask_id=lm.specials.mask, eos_id=lm.specials.stops[0],
                                      gen_length=32, threshold=threshold, edit_threshold=edit, max_post_steps=4)
    for cache in ("prefix", "none"):
        cfg = DecodeConfig(gen_len=32, block_len=32, rule="dynamic", threshold=threshold, edit_threshold=edit,
                           max_post_steps=4, cache=cache, early_stop=False)
        result = decode(lm, [prompt], cfg)[2]
        assert result.canvas[0].tolist() == trace.canvas[length:], cache
        assert result.edits == trace.edits


@pytest.mark.parametrize("cache", ["prefix", "none"])
def test_a_batch_decodes_each_row_as_alone(model, cache):
    """Rows are left-padded by whole blocks; padding never joins a row's routing block."""
    lm, _ = model
    cfg = DecodeConfig(gen_len=32, block_len=32, rule="dynamic", threshold=0.7, cache=cache, early_stop=False)
    prompts = [prompt_of(n, seed=i) for i, n in enumerate([3, 40, 33, 70])]
    batch = decode(lm, prompts, cfg)[2]
    for row, prompt in enumerate(prompts):
        alone = decode(lm, [prompt], cfg)[2]
        assert batch.canvas[row, :alone.canvas.shape[1]].tolist() == alone.canvas[0].tolist()


def test_sub_blocks_are_refused(model):
    """A sub-block forward would route part of a block: refused in one line."""
    lm, _ = model
    cfg = DecodeConfig(gen_len=32, block_len=32, sub_block_len=8, rule="dynamic", threshold=0.7, cache="dual")
    with pytest.raises(UserError, match="block routing"):
        decode(lm, [prompt_of(5)], cfg)


def test_a_block_len_off_the_routing_grid_is_refused(model):
    lm, _ = model
    with pytest.raises(UserError, match="must be a multiple of 32"):
        decode(lm, [prompt_of(5)], DecodeConfig(gen_len=32, block_len=16, rule="dynamic", threshold=0.7))


def test_routing_blocks_follow_positions_and_keep_padding_apart(model):
    """A row's real tokens are grouped by RoPE position // 32; its left padding (RoPE position 0,
    like its first token) forms a block of its own; no id is shared between rows."""
    from fastdllm.models.llada2_moe import routing_blocks
    lm, _ = model
    valid = torch.ones(2, 96, dtype=torch.bool)
    valid[0, :64] = False                                      # row 0: two blocks of left padding
    cache = lm.model.new_cache(valid, keep_kv=False, block=32)
    ids = routing_blocks(cache, 0, 96, 32)
    row0, row1 = ids[0].tolist(), ids[1].tolist()
    assert len(set(row0[:64])) == 1 and set(row0[:64]).isdisjoint(row0[64:])
    assert [len(set(row0[64:]))] == [1] and len(set(row1)) == 3 and set(row0).isdisjoint(row1)
    assert [row1[i] == row1[j] for i, j in [(0, 31), (31, 32), (32, 63), (64, 95)]] == [True, False, True, True]
    assert routing_blocks(cache, 32, 40, 32).tolist() == ids[:, 32:72].tolist()   # a span: the same ids
