"""dLLM-Cache, cache mode dllm_cache (docs/accelerators/dllm-cache.md 5.1): fastdllm in float64 step by step
against tests/references/reference_dllm_cache.py (a transcription of the authors' LLaDA generate and layer
hook, with their own split prompt/response cache of pre-RoPE K/V and features): commits, NFE, and
per layer which parts refreshed and which response slots were picked; refresh every step equal to
no cache; a left-padded batch equal to its rows; the refusals; the profile on the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import HEAVY_PROMPT
from dkv_trace import chat_prompt, commits, row_steps
from one_line import one_line_refusal
from reference_dllm_cache import dllm_cache_generate

from fastdllm.decode.config import ConfigError, DecodeConfig
from fastdllm.decode.engine import Batch, StepEvent, generate, run

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]   # tiny float64 ops (tests/conftest.py)


def cache_cfg(**kw):
    return DecodeConfig(**{**dict(gen_len=32, block_len=8, cache="dllm_cache", rule="fixed", prompt_interval=5,
                                  gen_interval=3, transfer_ratio=0.25, early_stop=False), **kw})


def ours(lm, prompts, cfg):
    """Per step the sorted [row, canvas position, token] commits, the layers' trace, the Result."""
    batch = Batch(lm.decoder, prompts, cfg)
    trace = batch.cache.features.trace = []
    steps = [commits(e, [len(p) for p in prompts]) for e in batch.events() if isinstance(e, StepEvent)]
    return steps, [(s, layer, p, r, None if picked is None else [sorted(row) for row in picked])
                   for s, layer, p, r, picked in trace], batch.result()


def theirs(lm, prompts, cfg):
    record, trace = [], []
    canvas, nfe = dllm_cache_generate(
        lm, torch.tensor(prompts), gen_length=cfg.gen_len, block_length=cfg.block_len, steps=cfg.total_steps,
        prompt_interval_steps=cfg.prompt_interval, gen_interval_steps=cfg.gen_interval,
        transfer_ratio=cfg.transfer_ratio, mask_id=lm.specials.mask, record=record, trace=trace)
    trace = [(s, layer, p, r, None if picked is None else [sorted(row) for row in picked])
             for s, layer, p, r, picked in trace]
    return record, trace, canvas, nfe


def assert_equal_to_theirs(lm, prompts, cfg):
    our_steps, our_trace, result = ours(lm, prompts, cfg)
    ref_steps, ref_trace, ref_canvas, ref_nfe = theirs(lm, prompts, cfg)
    assert result.nfe == ref_nfe == len(our_steps)
    assert our_trace == ref_trace                 # per layer: the same refreshes and the same picked slots
    assert our_steps == ref_steps                 # the same commits (positions and tokens)
    assert result.canvas.tolist() == ref_canvas[:, len(prompts[0]):].tolist()
    return our_trace


@pytest.mark.parametrize("fixture, boundary, gen_len", [("llada64", False, 32), ("llada64", True, 32),
                                                        ("llada64_heavy_mask", False, 32), ("dream64", False, 16)])
def test_step_by_step_equal_to_their_decoder(fixture, boundary, gen_len, request):
    """Blocks of 8, one token a step, Kp 5, Kr 3, r 0.25: refreshes of each part alone, of both,
    and partial updates between them all happen, and match theirs at every layer of every step.
    Dream: their Dream hook's branches (the same as LLaDA's) in LLaDA's loop, logits shifted
    (docs/accelerators/dllm-cache.md 5.1: their Dream loop, Dream's own sampler, is not transcribed); 16
    tokens (its 152k-word head makes the transcription slow)."""
    lm = request.getfixturevalue(fixture)
    prompt = chat_prompt(lm, boundary)
    assert (len(prompt) % 16 == 0) == boundary
    trace = assert_equal_to_theirs(lm, [prompt], cache_cfg(gen_len=gen_len))
    cached = [t for t in trace if t[1] > 0]
    kinds = {(p, r, picked is not None) for _, _, p, r, picked in cached}
    assert kinds == {(True, True, False), (True, False, True), (False, True, False), (False, False, True)}


def test_a_batch_two_a_step_and_no_transfer(llada64):
    """Their batch (equal-length prompts) at two commits a step with r 0.5; then r 0 (no partial
    update: cached features alone between refreshes) and one global canvas."""
    first = chat_prompt(llada64, False)
    second = llada64.encode("Write a function that multiplies two numbers.", chat=True)[:len(first)]
    assert len(second) == len(first) and second != first
    assert_equal_to_theirs(llada64, [first, second], cache_cfg(steps=16, transfer_ratio=0.5))
    trace = assert_equal_to_theirs(llada64, [first], cache_cfg(transfer_ratio=0.0, block_len=32, gen_interval=4))
    assert all(picked is None for *_, picked in trace)


def test_refreshing_every_step_is_no_cache(llada64):
    """Kp = Kr = 1: every layer recomputes everything every step, the same commits as no cache; and
    the cache does change the decode at the test's intervals (the comparison above is not vacuous)."""
    prompt = chat_prompt(llada64, False)
    plain = ours_plain(llada64, [prompt], cache_cfg(cache="none"))
    assert ours(llada64, [prompt], cache_cfg(prompt_interval=1, gen_interval=1))[0] == plain
    assert ours(llada64, [prompt], cache_cfg(prompt_interval=50, gen_interval=7))[0] != plain


def ours_plain(lm, prompts, cfg):
    return [commits(e, [len(p) for p in prompts]) for e in generate(lm.decoder, prompts, cfg)
            if isinstance(e, StepEvent)]


PROMPTS = ["Hi.", "Explain the block-wise KV cache in two sentences, please.", "What is 2 + 2?"]


@pytest.mark.parametrize("fixture", ["llada64", "dream64"])
def test_left_padded_batch_equals_its_rows(fixture, request):
    """Padding belongs to the prompt part and is masked out of attention; the response part and the
    schedule are the same, so each row commits as it does alone."""
    lm = request.getfixturevalue(fixture)
    prompts = [lm.encode(p, chat=True) for p in PROMPTS]
    assert len({len(p) for p in prompts}) == 3
    cfg = cache_cfg(gen_len=16)
    events = [e for e in generate(lm.decoder, prompts, cfg) if isinstance(e, StepEvent)]
    for row, prompt in enumerate(prompts):
        alone = [e for e in generate(lm.decoder, [prompt], cfg) if isinstance(e, StepEvent)]
        assert row_steps(events, row) == row_steps(alone, 0)


def test_refusals(llada64, tiny):
    from fastdllm.checkpoints import loading

    sdar = loading.load(tiny("sdar"), dtype="fp32")
    one_line_refusal(lambda: run(sdar.decoder, [[5, 6, 7]], DecodeConfig(gen_len=16, block_len=4, cache="dllm_cache")),
                     "cache dllm_cache: built for LLaDA and Dream only (their blocks host the feature cache); "
                     "tiny-sdar is refused")
    prompt = llada64.encode(HEAVY_PROMPT, chat=True)
    for bad, message in [(dict(refresh_every=4), "unset refresh_every"), (dict(block_align="grid", rule="threshold"),
                         "not combined with block_align grid"), (dict(dpad_window=8), "not combined with dpad"),
                         (dict(gen_interval=0), "gen_interval: 0 is below the minimum 1"),
                         (dict(transfer_ratio=1.5), "transfer_ratio: 1.5 is above the maximum 1.0")]:
        one_line_refusal(lambda: cache_cfg(**bad), message, ConfigError)
    one_line_refusal(lambda: run(llada64.decoder, [prompt + [llada64.specials.mask] * 8 + prompt], cache_cfg(),
                                 holes=[(len(prompt), len(prompt) + 8)]), "infilling")


def test_device_step_and_graphs_off(llada64, monkeypatch):
    """Where CUDA graphs would run (the forward built with graphs and the device step), the engine
    turns graphs off (the layers branch on the host's step count) and the eager device step decodes
    as the host path."""
    from fastdllm.decode import mask_loop

    prompt = chat_prompt(llada64, False)
    host = ours(llada64, [prompt], cache_cfg())
    used = []

    def factory(cls, model, canvas, cache, widen=True):
        used.append(cls(model, canvas, cache, graphs=True, full_block=True, widen=widen, device_step=True))
        return used[-1]

    monkeypatch.setattr(mask_loop.SpanForward, "for_model", classmethod(factory))
    device = ours(llada64, [prompt], cache_cfg())
    assert used and not used[0].graphs and mask_loop.DeviceStep.applies(cache_cfg(), False)
    assert device[:2] == host[:2] and device[2].canvas.tolist() == host[2].canvas.tolist()


def test_cli_generate_with_the_profile_on_the_builtin_model():
    from cli_runner import invoke

    from fastdllm.decode.profiles import find

    profile = find("dllm-cache")
    assert profile.values == dict(cache="dllm_cache", block_len=8, rule="fixed", steps=None, prompt_interval=50,
                                  gen_interval=7, transfer_ratio=0.25)
    r = invoke("generate", "--profile", "dllm-cache", "-n", "32", "--json", "def add(a, b):")
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    config = record["config"]
    assert record["profile"] == "dllm-cache" and config["cache"] == "dllm_cache"
    assert (config["prompt_interval"], config["gen_interval"], config["transfer_ratio"]) == (50, 7, 0.25)
    assert 0 < record["nfe"] <= 32


def test_cache_bytes_count_the_features(llada64):
    """The result's cache bytes: the K/V buffers plus two (B, T, d) feature tensors per layer."""
    prompt = chat_prompt(llada64, False)
    cfg = cache_cfg()
    result = run(llada64.decoder, [prompt], cfg)
    plain = run(llada64.decoder, [prompt], cache_cfg(cache="dkv", prompt_interval=50))
    c = llada64.model.config
    T = len(prompt) + cfg.gen_len
    assert result.cache_bytes == plain.cache_bytes + 2 * c.n_layers * T * c.d_model * 8     # float64
