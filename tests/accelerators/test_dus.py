"""DUS, the `dilated` rule (docs/accelerators/dus.md 6.3): its levels and spacing filter against the
transcription of the authors' functions (tests/references/reference_dus.py); fastdllm against the transcription
of their `generate_scheduled` in float64 (same (position, token) pairs at every step, same NFE) with
no cache and on the prefix/dual block cache, batch 1 and a left-padded batch; config refusals; the
profiles; the CLI."""

from __future__ import annotations

import json
import random

import pytest
import torch
from conftest import HEAVY_PROMPT
from reference_dus import generate_scheduled, merge_last, spacing_filter, unmask_levels
from cli_runner import invoke
from dus_trace import ours

from fastdllm.decode import profiles
from fastdllm.decode.config import ConfigError, DecodeConfig
from fastdllm.decode.dilation import dilated_levels, level_of, spaced, spacing_gap
from fastdllm.decode.rules import RULES
from fastdllm.decode.selection import select
from fastdllm.errors import UserError

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]
NO_LEVELS = "given no candidate levels"


# ---- the levels and the spacing filter, against the transcription ----

@pytest.mark.parametrize("skip", [1, 2])
@pytest.mark.parametrize("base", [1, 2, 3])
@pytest.mark.parametrize("length", [4, 8, 24, 32, 64])
def test_levels_equal_the_authors(length, base, skip):
    start = 13                                                   # theirs are absolute positions
    theirs = merge_last(unmask_levels(start, start + length - 1, base, skip))
    assert [list(level) for level in dilated_levels(length, base, skip)] == [[p - start for p in lv] for lv in theirs]
    assert sorted(i for lv in dilated_levels(length, base, skip) for i in lv) == list(range(length))
    assert [level_of(length, base, skip)[i] for i in range(length)] == \
        [next(t for t, lv in enumerate(theirs) if p in lv) for p in range(start, start + length)]


def test_levels_of_the_spec():
    assert dilated_levels(32, 2, 1) == ((0, 16), (8, 24), (4, 12, 20, 28), tuple(range(2, 32, 4)), tuple(range(1, 32, 2)))
    assert dilated_levels(4, 2, 1) == ((0, 2), (1, 3))                         # SDAR's blocks of 4
    assert dilated_levels(8, 3, 2) == (tuple(range(8)),)                        # L < base**skip: one level
    assert dilated_levels(8, 1, 1) == (tuple(range(8)),)
    assert len(dilated_levels(8, 4, 1)[-1]) >= len(dilated_levels(8, 4, 1)[-2])   # a short last level merged
    with pytest.raises(ValueError):
        dilated_levels(8, 0, 1)


def test_spacing_filter_equals_the_authors():
    rng = random.Random(0)
    for _ in range(200):
        L = rng.choice([8, 16, 32])
        masked = rng.randint(1, L)
        ranked = rng.sample(range(L), rng.randint(1, masked))          # a rule's choice, best first
        gap = spacing_gap(masked, L, 8)
        assert spaced(ranked, gap) == spacing_filter(ranked, masked, L, 8)
        accepted = spaced(ranked, gap)[0]
        assert accepted[0] == ranked[0] and all(abs(a - b) >= 2 for a in accepted for b in accepted if a != b)
    assert spacing_gap(32, 32, 8) == 8 and spacing_gap(3, 32, 8) == 2         # never below 2


def test_count_is_the_lowest_level_left_and_refuses_without_levels():
    cfg = DecodeConfig(rule="dilated")
    count = RULES["dilated"].count
    inf = float("-inf")
    sorted_level = torch.tensor([[1, 1, 2, 3], [2, 3, 3, 0], [0, 0, 0, 0]])   # ranked by level
    sorted_conf = -sorted_level.double()
    sorted_conf[1, 3] = inf                                                     # row 1: three candidates
    sorted_conf[2, :] = inf                                                     # row 2: none left
    assert count(sorted_conf, cfg, None, sorted_level).tolist() == [2, 1, 0]
    with pytest.raises(UserError, match=NO_LEVELS):                            # a caller that gave no levels
        select(torch.rand(1, 4), torch.ones(1, 4, dtype=torch.bool), cfg)


# ---- configuration and profiles ----

@pytest.mark.parametrize("values,words", [
    (dict(rule="dilated", steps=8), "one step per level"),
    (dict(rule="dilated", block_len=32, sub_block_len=8), "unset sub_block_len"),
    (dict(dilation_base=0), "dilation_base: 0 is below the minimum 1"),
    (dict(dilation_skip="x"), "dilation_skip: expected int"),
])
def test_config_refusals_are_one_line(values, words):
    with pytest.raises(ConfigError, match=words) as err:
        DecodeConfig.from_dict(values)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name,cache", [("dus", "none"), ("dual-dus", "dual")])
def test_profiles_load(name, cache):
    cfg = profiles.resolve(profiles.find(name), {})
    assert (cfg.rule, cfg.dilation_base, cfg.dilation_skip, cfg.block_len, cfg.cache) == ("dilated", 2, 1, 32, cache)
    assert cfg.steps is None and profiles.find(name).description


# ---- fastdllm against the transcription ----

def theirs(lm, prompt, cfg):
    record = []
    x, nfe = generate_scheduled(lm, torch.tensor([prompt]), gen_length=cfg.gen_len, block_length=cfg.block_len,
                                base=cfg.dilation_base, base_skip=cfg.dilation_skip, mask_id=lm.specials.mask,
                                cache=cfg.cache, record=record)
    return record, x[0, len(prompt):], nfe


FIXTURES = ["llada64", "dream64", "llada64_heavy_mask", "dream64_heavy_mask"]     # tests/conftest.py


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_step_by_step_equal_to_the_authors(fixture, cache, request):
    lm = request.getfixturevalue(fixture)
    prompt = lm.encode(HEAVY_PROMPT, chat=True)
    cfg = DecodeConfig(gen_len=32, block_len=8, rule="dilated", cache=cache, early_stop=False)
    (our_steps,), result = ours(lm, [prompt], cfg)
    ref_steps, ref_canvas, ref_nfe = theirs(lm, prompt, cfg)
    assert result.nfe == ref_nfe == 4 * len(dilated_levels(8, 2, 1))          # blocks x levels
    assert our_steps == ref_steps
    assert result.canvas[0].tolist() == ref_canvas.tolist()


@pytest.mark.parametrize("block_len,base,skip", [(16, 3, 1), (16, 2, 2), (8, 1, 1)])
def test_other_bases_equal_the_authors(block_len, base, skip, llada64):
    prompt = llada64.encode(HEAVY_PROMPT, chat=True)
    cfg = DecodeConfig(gen_len=32, block_len=block_len, rule="dilated", dilation_base=base, dilation_skip=skip,
                       cache="dual", early_stop=False)
    (our_steps,), result = ours(llada64, [prompt], cfg)
    ref_steps, _, ref_nfe = theirs(llada64, prompt, cfg)
    assert (our_steps, result.nfe) == (ref_steps, ref_nfe)


@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("fixture", ["llada64", "dream64"])
def test_left_padded_batch_equals_its_rows(fixture, cache, request):
    lm = request.getfixturevalue(fixture)
    prompts = [lm.encode(p, chat=True) for p in ("Hi.", HEAVY_PROMPT, "Explain the block-wise KV cache, please.")]
    cfg = DecodeConfig(gen_len=16, block_len=8, rule="dilated", cache=cache, early_stop=False)
    steps, result = ours(lm, prompts, cfg)
    for r, prompt in enumerate(prompts):
        ref_steps, ref_canvas, ref_nfe = theirs(lm, prompt, cfg)
        assert steps[r] == ref_steps and result.canvas[r].tolist() == ref_canvas.tolist()
    assert result.nfe == ref_nfe


def test_full_block_candidates_change_nothing(dream64, monkeypatch):
    """The CUDA-graph path's candidate list (every slot of the block, in position order)."""
    from fastdllm.decode import mask_loop

    prompts = [dream64.encode(p, chat=True) for p in ("Hi.", HEAVY_PROMPT)]
    cfg = DecodeConfig(gen_len=16, block_len=8, rule="dilated", cache="dual", early_stop=False)
    default = ours(dream64, prompts, cfg)
    monkeypatch.setattr(mask_loop.SpanForward, "for_model",
                        classmethod(lambda cls, model, canvas, cache, widen=True: cls(model, canvas, cache, graphs=False,
                                                                                  full_block=True, widen=widen)))
    padded = ours(dream64, prompts, cfg)
    assert padded[0] == default[0] and padded[1].canvas.tolist() == default[1].canvas.tolist()


def test_block_causal_blocks_of_four_commit_one_level_a_step(tiny):
    """SDAR (not the authors' setting): blocks of 4 are {0,2} {1,3}; the first block's prompt tail
    is no candidate, so a level with nothing masked is skipped, never a step that commits nothing."""
    from fastdllm.checkpoints import loading

    lm = loading.load(tiny("sdar"), dtype="fp64")
    prompt = torch.randint(1000, 30000, (6,), generator=torch.Generator().manual_seed(0)).tolist()   # 6 % 4: off the grid
    cfg = DecodeConfig(gen_len=16, block_len=4, rule="dilated", cache="prefix", early_stop=False)
    (steps,), _ = ours(lm, [prompt], cfg)
    levels = [set(lv) for lv in dilated_levels(4, 2, 1)]
    offsets = [{(p + len(prompt)) % 4 for p, _ in step} for step in steps if step]
    assert all(any(o <= lv for lv in levels) for o in offsets)                  # one level (or its masked part)
    assert offsets[:4] == [{2}, {3}, {0, 2}, {1, 3}]       # the prompt tail holds slots 0, 1; then whole levels


def test_renoising_family_refuses(tmp_path_factory):
    from fastdllm.checkpoints import loading
    from fastdllm.testing.tiny_gemma import write_diffusion_gemma
    from fastdllm.decode.engine import stepper

    path = write_diffusion_gemma(tmp_path_factory.mktemp("ckpt") / "tiny-gemma", canvas_length=16,
                                 max_denoising_steps=4, sliding_window=8, dtype=torch.float64)
    lm = loading.load(path, dtype="fp64")
    with pytest.raises(UserError, match="got 'dilated'") as err:
        stepper(lm.decoder, [[300, 301]], DecodeConfig(gen_len=16, block_len=16, rule="dilated"))
    assert "\n" not in str(err.value)


def test_cli_generate_with_the_profile(llada_dir):
    r = invoke("generate", "-m", llada_dir, "--profile", "dus", "-n", "64", "--no-early-stop", "--json", "Hello")
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["config"]["rule"] == "dilated" and record["nfe"] == 2 * 5      # 2 blocks of 32, 5 levels each
