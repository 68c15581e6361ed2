"""dKV-Cache-Decode, cache mode dkv (docs/accelerators/dkv.md 5.2): fastdllm in float64 step by step
against tests/references/reference_dkv.py (a transcription of the authors' LLaDA decoder and block forward,
with its own pre-RoPE cache), batch 1 and a batch of two; a left-padded batch equal to its rows;
the cache's K/V against a full forward; the refusals; the `dkv` profile on the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from dkv_trace import chat_prompt, commits, row_steps
from mask_heavy import max_mask_probability
from one_line import one_line_refusal
from reference_dkv import dkv_generate

from fastdllm.decode import mask_loop
from fastdllm.decode.config import ConfigError, DecodeConfig
from fastdllm.decode.engine import Batch, StepEvent, generate, run
from fastdllm.models.kv_cache import Slots

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]   # tiny float64 ops (tests/conftest.py)


def ours(lm, prompts, cfg):
    """Per step the sorted [row, canvas position, token] of every commit and the recomputed slots
    per row (None for a full forward), and the Result."""
    steps, sets, result = [], [], None
    for event in generate(lm.decoder, prompts, cfg):
        if isinstance(event, StepEvent):
            steps.append(commits(event, [len(p) for p in prompts]))
            first = event.span[0]
            sets.append(None if isinstance(first, int) else
                        [row[fresh].tolist() for row, fresh in zip(first.index, first.fresh)])
        else:
            result = event
    return steps, sets, result


def theirs(lm, prompts, cfg):
    record, recomputed = [], []
    steps = cfg.steps or cfg.gen_len
    canvas, nfe = dkv_generate(lm, torch.tensor(prompts), gen_length=cfg.gen_len, block_length=cfg.block_len,
                               steps=steps, cache_reloading_step=cfg.refresh_every, mask_id=lm.specials.mask,
                               record=record, recomputed=recomputed)
    return record, recomputed, canvas, nfe


def dkv_cfg(refresh_every, **kw):
    return DecodeConfig(**{**dict(gen_len=32, block_len=16, cache="dkv", rule="fixed", refresh_every=refresh_every,
                                  early_stop=False), **kw})


def assert_equal_to_theirs(lm, prompts, cfg):
    our_steps, our_sets, result = ours(lm, prompts, cfg)
    ref_steps, ref_sets, ref_canvas, ref_nfe = theirs(lm, prompts, cfg)
    assert result.nfe == ref_nfe == len(our_steps)
    assert our_sets == ref_sets                      # the same recomputed slots at every step
    assert our_steps == ref_steps                    # the same commits (positions and tokens)
    assert result.canvas.tolist() == ref_canvas[:, len(prompts[0]):].tolist()
    assert any(s is not None for s in our_sets)      # cached steps were taken
    return our_steps


@pytest.mark.parametrize("refresh_every", [2, 4, 8])     # llada_generate.py's default, dream_generate's, README's
@pytest.mark.parametrize("fixture, boundary", [("llada64", False), ("llada64", True), ("llada64_heavy_mask", False),
                                               ("dream64", False), ("dream64", True), ("dream64_heavy_mask", False)])
def test_step_by_step_equal_to_their_decoder(fixture, boundary, refresh_every, request):
    """Blocks of 16, one token a step: same recomputed slot sets, commits and NFE at every step."""
    lm = request.getfixturevalue(fixture)
    prompt = chat_prompt(lm, boundary)
    assert (len(prompt) % 16 == 0) == boundary
    assert_equal_to_theirs(lm, [prompt], dkv_cfg(refresh_every))
    if fixture.endswith("heavy_mask"):  # the fixture does not hide the normaliser
        assert max_mask_probability(lm, prompt + [lm.specials.mask] * 32) > 0.05


@pytest.mark.parametrize("fixture", ["llada64", "dream64"])
def test_two_tokens_a_step_a_batch_of_two_and_one_global_canvas(fixture, request):
    """Their batch (equal-length prompts), two commits a step; then the whole canvas as one block
    (Dream without blocks, where DualCache recomputes everything)."""
    lm = request.getfixturevalue(fixture)
    first = chat_prompt(lm, False)
    second = lm.encode("Write a function that multiplies two numbers.", chat=True)[:len(first)]
    assert len(second) == len(first) and second != first
    assert_equal_to_theirs(lm, [first, second], dkv_cfg(4, steps=16))
    assert_equal_to_theirs(lm, [first], dkv_cfg(8, block_len=32))


def test_the_delay_matters(llada64, monkeypatch):
    """The comparison is not vacuous: dkv commits differently from no cache, and from a cache that
    stores a position's K/V at the step it is committed (no delay: the slots masked at this step's
    start instead of the previous one's)."""
    prompt = chat_prompt(llada64, False)
    cfg = dkv_cfg(8)
    ref_steps = theirs(llada64, [prompt], cfg)[0]
    assert ours(llada64, [prompt], DecodeConfig(**{**cfg.to_dict(), "cache": "none"}))[0] != ref_steps
    batch = Batch(llada64.decoder, [prompt], cfg)
    span_for = mask_loop.span_for

    def undelayed(cfg, step, s, e, T, pending=None, **kw):
        now = Slots.delayed(batch.canvas.host == llada64.specials.mask, 0)
        return span_for(cfg, step, s, e, T, pending=now, **kw)

    monkeypatch.setattr(mask_loop, "span_for", undelayed)
    steps = [commits(event, [len(prompt)]) for event in batch.events() if isinstance(event, StepEvent)]
    assert len(steps) == len(ref_steps) and steps != ref_steps


PROMPTS = ["Hi.", "Explain the block-wise KV cache in two sentences, please.", "What is 2 + 2?"]


@pytest.mark.parametrize("fixture", ["llada64", "dream64"])
@pytest.mark.parametrize("rule", ["fixed", "threshold"])
def test_left_padded_batch_equals_its_rows(fixture, rule, request):
    """Per row sets of different sizes (padding, and under the threshold rule different commit
    counts): the batch pads them with filler slots whose cached K/V are kept, so every row commits
    what it commits alone."""
    lm = request.getfixturevalue(fixture)
    prompts = [lm.encode(p, chat=True) for p in PROMPTS]
    assert len({len(p) for p in prompts}) == 3
    cfg = dkv_cfg(4, rule=rule, threshold=0.7)
    batch = list(generate(lm.decoder, prompts, cfg))
    fillers = [e.span[0] for e in batch if isinstance(e, StepEvent) and not isinstance(e.span[0], int)]
    # equal counts under the fixed schedule (padding is never masked); filler where counts differ
    assert any(not bool(s.fresh.all()) for s in fillers) == (rule == "threshold")
    for row, prompt in enumerate(prompts):
        alone = list(generate(lm.decoder, [prompt], cfg))
        assert batch[-1].canvas[row].tolist() == alone[-1].canvas[0].tolist()
        assert row_steps(batch, row) == row_steps(alone, 0)


@pytest.mark.parametrize("fixture", ["llada64", "dream64"])
def test_cache_after_a_refresh_equals_a_full_forward(fixture, request):
    """At a refresh step the K/V buffers hold a full forward's over that step's input canvas; at
    the cached step before it they do not (the delayed cache is an approximation)."""
    lm = request.getfixturevalue(fixture)
    model = lm.model
    cfg = dkv_cfg(4)
    batch = Batch(lm.decoder, [chat_prompt(lm, False)], cfg)
    canvas = batch.forward.canvas

    def full_kv(ids):
        cache = model.new_cache(batch.canvas.valid)
        with torch.no_grad():
            model.forward_span(ids, 0, ids.shape[1], cache, torch.zeros(1, 1, dtype=torch.long))
        return cache

    checked, before = [], canvas.clone()
    for event in batch.events():
        if isinstance(event, StepEvent) and event.block == 0 and event.step in (3, 4):
            reference = full_kv(before)                           # this step's input canvas
            same = all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in
                       zip(batch.cache.keys + batch.cache.values, reference.keys + reference.values))
            checked.append((event.step, isinstance(event.span[0], int), same))
        before = canvas.clone()
    assert checked == [(3, False, False), (4, True, True)]


def test_device_step_decodes_dkv_as_the_host_path(llada64, monkeypatch):
    """DeviceStep.applies does not look at the cache mode: its eager forward takes the position set
    (a Slots span never repeats, so no graph is captured for it). Same commits as the host path."""
    prompt = chat_prompt(llada64, False)
    cfg = dkv_cfg(4)
    host = ours(llada64, [prompt], cfg)
    used = []

    def factory(cls, model, canvas, cache, widen=True):
        forward = cls(model, canvas, cache, graphs=False, full_block=False, widen=widen, device_step=True)
        used.append(forward)
        return forward

    monkeypatch.setattr(mask_loop.SpanForward, "for_model", classmethod(factory))
    device = ours(llada64, [prompt], cfg)
    assert used and mask_loop.DeviceStep.applies(cfg, False)
    assert device[:2] == host[:2] and device[2].canvas.tolist() == host[2].canvas.tolist()


@pytest.mark.parametrize("family", ["llada_moe", "rnd1"])
def test_moe_families_a_position_set_over_an_exact_cache_equals_a_full_forward(family, tmp_path_factory):
    """The set forward is family-agnostic (it only moves ids, positions and K/V): on LLaDA-MoE and
    RND1 (no transcription of theirs), after a full forward over a left-padded canvas, recomputing
    a set of slots of different sizes per row (filler in the shorter one) against that cache gives
    the full forward's logits and K/V; then a dkv generation (RND1: its global canvas) takes cached steps."""
    from fastdllm.checkpoints import loading
    from fastdllm.testing.tiny_moe import write_llada_moe
    from fastdllm.testing.tiny_rnd1 import write_rnd1

    writer = write_llada_moe if family == "llada_moe" else write_rnd1
    lm = loading.load(writer(tmp_path_factory.mktemp("ckpt") / family), dtype="fp64")
    model, T = lm.model, 24
    ids = torch.randint(5, 200, (2, T), generator=torch.Generator().manual_seed(0))
    valid = torch.ones(2, T, dtype=torch.bool)
    valid[1, :4] = False
    positions = torch.arange(T).expand(2, T)
    exact, again = model.new_cache(valid), model.new_cache(valid)
    with torch.no_grad():
        full = model.forward_span(ids, 0, T, exact, positions)
        model.forward_span(ids, 0, T, again, positions)
        wanted = torch.zeros(2, T, dtype=torch.bool)
        wanted[0, [3, 9, 10, 17, 22]], wanted[1, [6, 12]] = True, True
        for buffer in again.keys + again.values:
            buffer.masked_fill_(wanted[:, None, :, None], 7.0)       # stale values where the set recomputes
        shift = model.logit_shift
        asked = torch.tensor([[9 + shift, 17 + shift], [6 + shift, 12 + shift]])
        out = model.forward_span(ids, Slots.of(wanted), T, again, asked)
    torch.testing.assert_close(out, full.gather(1, asked[..., None].expand(-1, -1, full.shape[-1])), rtol=0, atol=1e-10)
    for a, b in zip(again.keys + again.values, exact.keys + exact.values):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    cfg = dkv_cfg(4) if family == "llada_moe" else \
        DecodeConfig(gen_len=32, block_len=32, cache="dkv", refresh_every=4, rule="entropy_schedule", confidence="entropy")
    _, sets, result = ours(lm, [lm.encode("Hello there", chat=False)], cfg)
    assert result.committed == 32 and sum(s is not None for s in sets) > len(sets) // 2


# --- refusals, the profile, the CLI ---------------------------------------------------------------

@pytest.mark.parametrize("values, message", [
    (dict(cache="dkv", block_len=16, sub_block_len=4), "cache dkv recomputes masked slots anywhere; unset sub_block_len"),
    (dict(cache="dkv", gen_len=64, block_len=16, dpad_window=32),
     "dpad: not combined with the dkv cache"),
    (dict(cache="dkv", refresh_every="0"), "refresh_every: 0 is below the minimum 1"),
])
def test_config_errors_are_one_line(values, message):
    one_line_refusal(lambda: DecodeConfig.from_dict(values), message, ConfigError)


def test_block_causal_and_renoising_families_refused_in_one_line(tiny):
    from fastdllm.checkpoints import loading

    sdar = loading.load(tiny("sdar"), dtype="fp32")
    one_line_refusal(lambda: run(sdar.decoder, [[5, 6, 7]], DecodeConfig(gen_len=16, block_len=4, cache="dkv")),
                     "cache dkv delays caching of decoded tokens under bidirectional attention;")
    gemma = loading.load(tiny("diffusion_gemma", canvas_length=16, max_denoising_steps=4), dtype="fp32")
    cfg = DecodeConfig(gen_len=16, block_len=16, rule="threshold", cache="dkv")
    one_line_refusal(lambda: run(gemma.decoder, [[5, 6, 7]], cfg), "cache dkv caches decoded tokens;")


def test_cli_generate_with_the_dkv_profile(llada_dir):
    from cli_runner import invoke

    from fastdllm.decode.profiles import find

    profile = find("dkv")
    assert profile.values == dict(cache="dkv", block_len=64, rule="fixed", refresh_every=8)
    DecodeConfig.from_dict(profile.values)
    r = invoke("generate", "-m", llada_dir, "--profile", "dkv", "-n", "64", "--json", "Hello")
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["profile"] == "dkv"
    config = record["config"]
    assert (config["cache"], config["refresh_every"], config["rule"], config["block_len"]) == ("dkv", 8, "fixed", 64)
    assert 0 < record["nfe"] <= 64
