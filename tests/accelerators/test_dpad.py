"""DPad's suffix dropout (docs/accelerators/dpad.md 2): the keep profile and the kept-set draw (window,
decay, seed), the layout in the cache (original positions, key mask, spans ending at E), one-line
refusals, and fastdllm in float64 step by step against tests/references/reference_dpad.py (a transcription of
their generate / generate_with_prefix_cache / generate_with_dual_cache on a physically pruned
canvas), batch 1 and left-padded batches, plus the `dpad` profile on the CLI.

The kept set is one documented draw on both sides (a CPU generator seeded with cfg.seed, T - e
float32 uniforms a block): the transcription draws it itself from the same seed, and the first
test checks that fastdllm's draw is that one."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from mask_heavy import max_mask_probability, prompt_of
from one_line import one_line_refusal
from reference_dpad import dpad_generate, draw_suffix, gaussian_keep

from fastdllm.decode import mask_loop
from fastdllm.decode.canvas import plan
from fastdllm.decode.config import ConfigError, DecodeConfig
from fastdllm.decode.engine import StepEvent, generate, run, stepper
from fastdllm.decode.suffix_dropout import SuffixDropout, draw_kept, keep_profile
from fastdllm.models.kv_cache import CanvasCache

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]   # tiny float64 ops (tests/conftest.py)

SETTINGS = [(4.0, 2.0), (3.0, 2.3), (3.0, 3.0)]      # (k, scale); scale 3: keep[0] = 1.2 > 1, always kept


# --- the profile and the draw ----------------------------------------------------------------------

@pytest.mark.parametrize("k, scale", SETTINGS + [(3.0, 1.6)])
@pytest.mark.parametrize("window", [1, 64, 256])
def test_keep_profile_is_their_gaussian_in_float32(k, scale, window):
    cfg = DecodeConfig(gen_len=256, block_len=32, dpad_window=window, dpad_k=k, dpad_scale=scale)
    prob = keep_profile(cfg)
    assert prob.dtype == torch.float32 and prob.shape == (256,)
    assert torch.equal(prob, gaussian_keep(256, window, k, scale))           # bit for bit
    assert abs(float(prob[0]) - scale * 0.3989422804014327) < 1e-6           # scale / sqrt(2 pi)
    if window > 1:
        assert abs(float(prob[window - 1]) - scale * 0.3989422804014327 * torch.exp(torch.tensor(-k * k / 2.0))) < 1e-6
        assert bool((prob[1:window] <= prob[:window - 1]).all())              # decays with distance
    assert not prob[window:].any()                                            # nothing past the window


def test_expected_kept_counts_of_their_scripts():
    """docs/accelerators/dpad.md 2.2: about 64, 68 and 49 kept slots."""
    for (w, k, sc), n in [((256, 4.0, 2.0), 64), ((256, 3.0, 1.6), 68), ((128, 3.0, 2.3), 49)]:
        prob = keep_profile(DecodeConfig(gen_len=512, block_len=32, dpad_window=w, dpad_k=k, dpad_scale=sc))
        assert abs(float(prob.clamp(max=1).sum()) - n) < 1.0


def canvas_and_cache(prompts, cfg, pad=0, mask=1):
    canvas = plan(prompts, cfg, mask=mask, pad=pad, causal=False, context_length=10_000)
    cache = CanvasCache.allocate(canvas.valid, layers=[], kv_heads=1, head_dim=1, keep_kv=False)
    return canvas, cache


@pytest.mark.parametrize("seed", [0, 1234])
def test_the_draw_is_the_transcriptions_and_lays_the_kept_slots_out_with_their_positions(seed):
    cfg = DecodeConfig(gen_len=128, block_len=16, dpad_window=64, dpad_k=3.0, dpad_scale=2.3, seed=seed)
    prompts = [[5] * 7, [6] * 3]                                              # row 1 left-padded by 4
    canvas, cache = canvas_and_cache(prompts, cfg)
    true_positions = cache.positions.clone()
    dpad = SuffixDropout(cfg, canvas, cache)
    theirs = torch.Generator().manual_seed(seed)
    pdf = gaussian_keep(128, 64, 3.0, 2.3)
    T, seen = canvas.length, []
    for s, e in canvas.blocks:
        E = dpad.block(s, e)
        kept = draw_suffix(pdf, e, T, theirs)                                 # canvas slots, increasing
        assert (dpad.kept + e).tolist() == kept.tolist() and E == e + len(kept)
        assert bool((dpad.kept < 64).all())                                   # inside the window
        # the kept slots sit at [e, E) with their original RoPE positions; before e nothing moved
        assert torch.equal(cache.positions[:, e:E], true_positions[:, kept])
        assert torch.equal(cache.positions[:, :e], true_positions[:, :e])
        mask = cache.key_mask[:, 0, 0]
        assert torch.equal(mask[:, :e], canvas.valid[:, :e]) and bool(mask[:, e:E].all()) and not mask[:, E:].any()
        seen.append(dpad.kept.tolist())
    assert len({tuple(k) for k in seen}) > 1                                  # redrawn per block
    again = SuffixDropout(cfg, *canvas_and_cache(prompts, cfg))
    assert (again.block(*canvas.blocks[0]), again.kept.tolist()) == (canvas.blocks[0][1] + len(seen[0]), seen[0])
    other = SuffixDropout(dataclasses.replace(cfg, seed=seed + 1), *canvas_and_cache(prompts, cfg))
    other.block(*canvas.blocks[0])
    assert other.kept.tolist() != seen[0]                                     # the seed decides


def test_kept_density_decays_with_distance():
    cfg = DecodeConfig(gen_len=256, block_len=32, dpad_window=128, dpad_k=3.0, dpad_scale=2.0)
    prob, generator = keep_profile(cfg), torch.Generator().manual_seed(0)
    counts = torch.zeros(224)
    for _ in range(400):
        counts[draw_kept(prob, 224, generator)] += 1
    near, middle, far = counts[:16].mean() / 400, counts[56:72].mean() / 400, counts[128:].sum()
    assert abs(float(near) - float(prob[:16].mean())) < 0.05 and float(middle) < float(near) - 0.2 and far == 0


def test_a_shorter_row_masks_kept_slots_past_its_end():
    cfg = DecodeConfig(gen_len=64, block_len=16, dpad_window=64, dpad_k=0.0, dpad_scale=3.0)   # keep all
    canvas, cache = canvas_and_cache([[5] * 4, [6] * 4], cfg)
    canvas.valid[1, 4 + 32:] = False                                           # row 1: gen_len 32
    dpad = SuffixDropout(cfg, canvas, cache)
    E = dpad.block(4, 20)
    assert E == canvas.length and dpad.kept.tolist() == list(range(48))
    assert cache.key_mask[0, 0, 0, 20:].all() and cache.key_mask[1, 0, 0, 20:36].all()
    assert not cache.key_mask[1, 0, 0, 36:].any()


# --- refusals ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("values, message", [
    (dict(dpad_window=64, rule="entropy_schedule", gen_len=64, block_len=64, confidence="entropy"),
     "dpad needs blocks after the active one; the entropy_schedule rule decodes one global canvas"),
    (dict(dpad_window=64, prophet=True, answer_anchor="10:The"), "dpad: not combined with prophet"),
    (dict(dpad_window=64, cache="dkv"), "dpad: not combined with the dkv cache"),
    (dict(dpad_window="0"), "dpad_window: 0 is below the minimum 1"),
    (dict(dpad_scale="0"), "dpad_scale: 0.0 must be greater than 0.0"),
    (dict(dpad_k="-1"), "dpad_k: -1.0 is below the minimum 0.0"),
    (dict(dpad_windw="8"), "did you mean 'dpad_window'"),
])
def test_config_errors_are_one_line(values, message):
    one_line_refusal(lambda: DecodeConfig.from_dict(values), message, ConfigError)


def test_block_causal_renoising_and_infilling_refused_in_one_line(llada64, tiny):
    from fastdllm.checkpoints import loading

    sdar = loading.load(tiny("sdar"), dtype="fp32")
    cfg = DecodeConfig(gen_len=16, block_len=4, dpad_window=8)
    one_line_refusal(lambda: run(sdar.decoder, [[5, 6, 7]], cfg), "attends block-causally and never sees it")
    gemma = loading.load(tiny("diffusion_gemma", canvas_length=16, max_denoising_steps=4), dtype="fp32")
    cfg = DecodeConfig(gen_len=16, block_len=16, rule="threshold", dpad_window=8)
    one_line_refusal(lambda: run(gemma.decoder, [[5, 6, 7]], cfg), "dpad drops masked suffix slots;")
    mask = llada64.specials.mask
    head = llada64.encode("def f(x):", chat=False)
    row = head + [mask] * 8 + llada64.encode(" return x", chat=False)
    cfg = DecodeConfig(gen_len=8, block_len=4, dpad_window=8)
    one_line_refusal(lambda: run(llada64.decoder, [row], cfg, holes=[(len(head), len(head) + 8)]),
                     "suffix dropout needs a masked suffix")


# --- fastdllm against the transcription, float64 ----------------------------------------------------

def ours(lm, prompts, cfg, decoder=None):
    """Per step the sorted [row, canvas position, token] of every commit and the span; per block
    (kept canvas slots, E); and the Result."""
    steps, spans, blocks = [], [], []
    batch = stepper(decoder or lm.decoder, prompts, cfg)
    P = batch.canvas.starts[0]
    original = batch.dpad.block

    def block(s, e):                               # record each block's draw as the engine makes it
        E = original(s, e)
        blocks.append(((batch.dpad.kept + e).tolist(), E))
        return E

    batch.dpad.block = block
    for event in batch.events():
        if isinstance(event, StepEvent):
            c = event.committed
            rows, at = c.nonzero()[:, 0], event.positions[c] + P
            steps.append(sorted([int(r), int(p), int(t)] for r, p, t in zip(rows, at, event.tokens[c])))
            spans.append(tuple(event.span))
    return steps, spans, blocks, batch.result()


def theirs(lm, prompt, cfg, stop_ids, **kw):
    record, blocks = [], []
    canvas, nfe = dpad_generate(lm, torch.tensor([prompt]), cache=cfg.cache, gen_length=cfg.gen_len,
                                block_length=cfg.block_len, window=cfg.dpad_window, k=cfg.dpad_k,
                                scale=cfg.dpad_scale, seed=cfg.seed, mask_id=lm.specials.mask,
                                steps=cfg.steps, threshold=cfg.threshold if cfg.rule == "threshold" else None,
                                stop_ids=stop_ids, early_termination=cfg.early_stop, record=record,
                                blocks=blocks, **kw)
    return record, blocks, canvas[0, len(prompt):], nfe


def dpad_cfg(cache, rule, k, scale, **kw):
    """The spec's fixture setting: 128 tokens in blocks of 16, window 64; their threshold rule or
    one token a step (the fixed rule, steps = gen_len)."""
    return DecodeConfig(**{**dict(gen_len=128, block_len=16, cache=cache, rule=rule, threshold=0.9,
                                  dpad_window=64, dpad_k=k, dpad_scale=scale), **kw})


def assert_equal_to_theirs(lm, prompt, cfg, decoder=None):
    stops = (decoder or lm.decoder).specials.stops
    steps, spans, blocks, result = ours(lm, [prompt], cfg, decoder)
    ref_steps, ref_blocks, ref_canvas, ref_nfe = theirs(lm, prompt, cfg, stops)
    assert result.nfe == ref_nfe == len(steps)
    assert any(E < len(prompt) + cfg.gen_len for _, E in blocks)             # something was dropped
    assert [(kept, E) for kept, E, _ in ref_blocks] == blocks                 # the same kept slots and E
    assert spans == [span for _, _, block_spans in ref_blocks for span in block_spans]   # never past E
    assert steps == ref_steps                                                  # commits, step by step
    decoded = len(ref_blocks) * cfg.block_len                                 # theirs writes EOS after an early end
    assert result.canvas[0, :decoded].tolist() == ref_canvas[:decoded].tolist()
    return steps, result


@pytest.mark.parametrize("rule", ["threshold", "fixed"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("fixture, boundary, setting", [("llada64", False, 0), ("llada64", True, 1),
                                                         ("llada64_heavy_mask", False, 2)])
def test_llada_step_by_step_equal_to_their_decoder(fixture, boundary, setting, cache, rule, request):
    lm = request.getfixturevalue(fixture)
    prompt = prompt_of(lm, boundary)
    assert (len(prompt) % 16 == 0) == boundary
    cfg = dpad_cfg(cache, rule, *SETTINGS[setting], early_stop=False)
    assert_equal_to_theirs(lm, prompt, cfg)
    if fixture.endswith("heavy_mask"):  # the fixture does not hide the normaliser
        assert max_mask_probability(lm, prompt + [lm.specials.mask] * cfg.gen_len) > 0.05


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("fixture", ["dream64", "dream64_heavy_mask"])
def test_dream_step_by_step_equal_to_their_decoder(fixture, cache, request):
    """Dream (shifted logits: a cached span starts one slot before the block); 48 tokens, window 32
    (Dream's 152k head makes the naive forward slow)."""
    lm = request.getfixturevalue(fixture)
    cfg = dpad_cfg(cache, "threshold", 3.0, 2.3, gen_len=48, dpad_window=32, early_stop=False)
    assert_equal_to_theirs(lm, prompt_of(lm, False), cfg)


def test_dream_one_token_a_step_on_the_grid(dream64):
    cfg = dpad_cfg("dual", "fixed", 4.0, 2.0, gen_len=48, dpad_window=32, early_stop=False)
    assert_equal_to_theirs(dream64, prompt_of(dream64, True), cfg)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_early_termination_ends_on_the_same_block(llada64, cache):
    """Their -e (every DPad script) is fastdllm's early_stop at batch 1. Random weights rarely write
    a stop token, so a token the answer writes early is made the stop token on both sides."""
    prompt = prompt_of(llada64, False)
    cfg = dpad_cfg(cache, "threshold", 4.0, 2.0, early_stop=False)
    steps, _ = assert_equal_to_theirs(llada64, prompt, cfg)
    stop = steps[20][0][2]                                                     # committed in block 1 or 2
    decoder = dataclasses.replace(llada64.decoder, specials=dataclasses.replace(llada64.specials, stops=(stop,)))
    cfg = dataclasses.replace(cfg, early_stop=True)
    early, result = assert_equal_to_theirs(llada64, prompt, cfg, decoder)
    assert len(early) < len(steps) and result.nfe == len(early)


def test_dropout_changes_the_decisions(llada64):
    """The comparisons above are not vacuous: without DPad (or with another seed) the steps differ."""
    prompt = prompt_of(llada64, False)
    cfg = dpad_cfg("prefix", "threshold", 4.0, 2.0, early_stop=False)
    with_dpad = ours(llada64, [prompt], cfg)[0]
    without = [sorted([0, int(p) + len(prompt), int(t)] for p, t in zip(e.positions[e.committed], e.tokens[e.committed]))
               for e in generate(llada64.decoder, [prompt], dataclasses.replace(cfg, dpad_window=None))
               if isinstance(e, StepEvent)]
    assert with_dpad != without
    assert with_dpad != ours(llada64, [prompt], dataclasses.replace(cfg, seed=1))[0]


PROMPTS = ["Hi.", "Explain the block-wise KV cache in two sentences, please.", "What is 2 + 2?"]


def row_steps(steps, row):
    """One row's commits, empty steps left out: [[position, token], ...] per step."""
    out = [[[p, t] for r, p, t in step if r == row] for step in steps]
    return [s for s in out if s]


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_left_padded_batch_equals_its_rows(llada64, cache):
    """The draw is shared by every row (theirs); a left-padded row gets the same kept offsets and
    positions as alone, so it commits what it commits alone."""
    prompts = [llada64.encode(p, chat=True) for p in PROMPTS]
    assert len({len(p) for p in prompts}) == 3
    cfg = dpad_cfg(cache, "threshold", 3.0, 2.3, gen_len=64, dpad_window=32, early_stop=False)
    steps, _, blocks, result = ours(llada64, prompts, cfg)
    P = max(len(p) for p in prompts)
    for row, prompt in enumerate(prompts):
        alone_steps, _, alone_blocks, alone = ours(llada64, [prompt], cfg)
        assert result.canvas[row].tolist() == alone.canvas[0].tolist()
        shift = P - len(prompt)
        assert [[[p - shift, t] for p, t in step] for step in row_steps(steps, row)] == row_steps(alone_steps, 0)
        assert [[k - P for k in kept] for kept, _ in blocks] == [[k - len(prompt) for k in kept] for kept, _ in alone_blocks]


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_the_device_step_decodes_the_same(llada64, cache, monkeypatch):
    """DPad leaves DeviceStep.applies as it is: the device step (CPU here, no graphs) runs the same
    spans against the same cache layout and commits what the host path commits."""
    prompt = prompt_of(llada64, False)
    cfg = dpad_cfg(cache, "threshold", 3.0, 2.3, gen_len=64, dpad_window=32, early_stop=False)
    host = ours(llada64, [prompt], cfg)
    used = []

    def factory(cls, model, canvas, cache, widen=True):
        used.append(cls(model, canvas.clone(), cache, graphs=False, full_block=True, widen=widen, device_step=True))
        return used[-1]

    monkeypatch.setattr(mask_loop.SpanForward, "for_model", classmethod(factory))
    device = ours(llada64, [prompt], cfg)
    assert used and mask_loop.DeviceStep.applies(cfg, False)
    assert device[:3] == host[:3] and device[3].canvas.tolist() == host[3].canvas.tolist()


def test_cli_generate_with_the_dpad_profile(llada_dir):
    from cli_runner import invoke

    from fastdllm.decode.profiles import find

    profile = find("dpad")
    assert profile.values == dict(gen_len=1024, block_len=32, cache="prefix", rule="threshold", threshold=0.9,
                                  dpad_window=256, dpad_k=3.0, dpad_scale=1.6)
    DecodeConfig.from_dict(profile.values)
    r = invoke("generate", "-m", llada_dir, "--profile", "dpad", "-n", "256", "--json", "Hello")
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["profile"] == "dpad"
    config = record["config"]
    assert (config["dpad_window"], config["dpad_k"], config["dpad_scale"], config["gen_len"], config["cache"]) == \
        (256, 3.0, 1.6, 256, "prefix")
    assert 0 < record["nfe"] <= 256
