"""Prophet (docs/accelerators/prophet.md 3): the gap test on known logits, its one-line config errors, and
fastdllm in float64 step by step against tests/references/reference_prophet.py (a transcription of
pixeli99/Prophet's generate_earlyexit.generate), without cache (theirs) and on Fast-dLLM's
prefix/dual cache (fastdllm's composition), batches with left padding, refusals and the CLI.

The tiny random checkpoints' top-2 gaps are 0.4 to 1.8 logits, below the authors' thresholds
(7.5 / 5 / 2.5), so with those the exit never fires here (NEVER below is the same case made
explicit); the cases that fire use thresholds inside that range, one phase at a time."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import HEAVY_PROMPT
from mask_heavy import prompt_of
from one_line import one_line_refusal
from reference_prophet import prophet_generate

from fastdllm.decode.canvas import plan
from fastdllm.decode.config import ConfigError, DecodeConfig
from fastdllm.decode.decoder import Decoder, SpecialTokens
from fastdllm.decode.engine import StepEvent, run, stepper
from fastdllm.decode.prophet import Check, Prophet, anchor_tokens, threshold, top2_gap
from fastdllm.errors import UserError

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]   # tiny float64 ops (tests/conftest.py)

NEVER = (1e9, 1e9, 1e9)
# Thresholds that fire in one phase only, after its first step, chosen from each prompt's gaps
# (prompt_of: off the block grid, on it); "cached": at block 2's first (full) forward, mid phase.
PHASES = {"early": {False: (1.6, 1e9, 1e9), True: (0.6, 1e9, 1e9)},
          "mid": {False: (1e9, 1.3, 1e9), True: (1e9, 1.0, 1e9)},
          "late": {False: (1e9, 1e9, 1.05), True: (1e9, 1e9, 1.05)},
          "cached": {False: (1e9, 0.55, 1e9), True: (1e9, 0.55, 1e9)},
          "never": {False: NEVER, True: NEVER}}
ANCHOR = "20:The|21:answer|22:is"       # the answer region in the second block of 16 (gen_len 32)


# --- the test on known logits ------------------------------------------------------------------

def test_gap_is_top1_minus_top2_over_the_full_vocabulary_in_the_logits_dtype():
    logits = torch.tensor([[[3.0, 1.0, 2.5, -1.0], [0.0, 0.0, 0.0, 0.0]]])
    assert top2_gap(logits).tolist() == [[0.5, 0.0]] and top2_gap(logits).dtype == torch.float64
    half = torch.tensor([[[1.0, 1.0 + 2 ** -9, 0.0]]], dtype=torch.bfloat16)   # the gap rounds in bf16
    assert float(top2_gap(half)[0, 0]) == float(half[0, 0, 1] - half[0, 0, 0])


def test_threshold_follows_their_phases():
    cfg = DecodeConfig(prophet=True, answer_anchor=ANCHOR, prophet_early=3, prophet_mid=2, prophet_late=1)
    assert [threshold(cfg, p) for p in (0.0, 0.3299, 0.33, 0.6699, 0.67, 1.0)] == [3, 3, 2, 2, 1, 1]
    assert threshold(cfg, 84 / 256) == 3 and threshold(cfg, 85 / 256) == 2   # their global_step / steps


def test_anchor_words_are_encoded_with_a_space_and_later_words_win_an_overlap():
    encode = {" The": [7, 8], " answer": [9], " is": [10, 11, 12]}.__getitem__
    assert anchor_tokens("4:The|5:answer|7:is", encode) == {4: 7, 5: 9, 7: 10, 8: 11, 9: 12}


class Prophetish:
    """The state a Check reads: answer region and where the masks are (B = 2, T = 8)."""
    def __init__(self, region):
        self.region = region
        self.exited, self.exit_nfe = torch.zeros(2, dtype=torch.bool), [None, None]


def test_check_reads_the_answer_and_every_mask_once_and_fills_only_an_exiting_row():
    region = torch.zeros(2, 8, dtype=torch.bool)
    region[:, 5:7] = True
    masked = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1], [0, 0, 1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    check = Check(Prophetish(region), masked, torch.tensor([1.0, 1.0], dtype=torch.float64), nfe=1)
    block = torch.tensor([[2, 3], [2, 3]])                             # the block's slots (K = 2)
    asked = check.widen(block)
    for row in range(2):                                              # distinct; answer and masks covered
        slots = asked[row].tolist()
        assert len(set(slots)) == len(slots) and slots[:2] == [2, 3]
        assert set(region[row].nonzero()[:, 0].tolist()) | set(masked[row].nonzero()[:, 0].tolist()) <= set(slots)
    assert check.fill_at.tolist() == [[True, False, True, True], [False, False, False, False]]
    logits = torch.zeros(2, asked.shape[1], 4, dtype=torch.float64)
    logits[:, :, 1] = torch.where(check.answer, 1.5, 9.0)              # gap 1.5 on the answer, 9 elsewhere
    logits[1][check.answer[1]] = torch.tensor([0.0, 0.5, 0.0, 0.0], dtype=torch.float64)   # row 1: gap 0.5
    assert check.test(logits).shape == (2, 2, 4)
    assert check.gap.tolist() == [1.5, 0.5] and check.passed.tolist() == [True, False]
    tokens, conf, chosen = torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2), torch.tensor([[True, False]] * 2)
    candidate = torch.tensor([[True, True], [True, False]])
    tokens, conf, chosen = check.fill(tokens, conf, chosen, candidate, DecodeConfig(), [3], None)
    assert chosen.tolist() == [[True, True, True, False, True, True], [True, False, False, False, False, False]]
    assert tokens[0, 2:].tolist() == [1, 1, 1, 1]                     # the argmax (mask id 3 banned)


@pytest.mark.parametrize("values, message", [
    (dict(prophet=True), "prophet: set answer_anchor (e.g. '200:The|201:answer|202:is'): the gap is measured"),
    (dict(prophet=True, answer_anchor="200The"), "answer_anchor: '200The' is not offset:word"),
    (dict(prophet=True, answer_anchor="x:The"), "answer_anchor: 'x:The' is not offset:word"),
    (dict(prophet=True, answer_anchor="254:The"), "answer_anchor: offset 254 leaves no answer region inside gen_len 256"),
    (dict(prophet=True, answer_anchor=ANCHOR, credit=True), "prophet: not combined with credit (unset one)"),
    (dict(prophet=True, answer_anchor=ANCHOR, edit_threshold=0.5), "prophet: not combined with edit_threshold"),
    (dict(prophet=True, answer_anchor=ANCHOR, rule="eb_sampler"), "prophet commits masked positions early"),
    (dict(answer_tokens="0"), "answer_tokens: 0 is below the minimum 1"),
    (dict(prophet_mid="nan"), "prophet_mid: expected a finite number"),
    (dict(prophet="maybe"), "prophet: expected bool, got 'maybe'"),
    (dict(prophet_erly="1"), "did you mean 'prophet_early'"),
])
def test_config_errors_are_one_line(values, message):
    one_line_refusal(lambda: DecodeConfig.from_dict(values), message, ConfigError)


# --- fastdllm against the transcription, float64 ----------------------------------------------------

def prophet_cfg(cache, thresholds, anchor=ANCHOR, gen_len=32, **kw):
    early, mid, late = thresholds
    return DecodeConfig(**{**dict(gen_len=gen_len, block_len=16, cache=cache, rule="fixed", early_stop=False,
                                  prophet=True, answer_anchor=anchor, prophet_early=early, prophet_mid=mid,
                                  prophet_late=late), **kw})


def ours(lm, prompts, cfg):
    """Row 0's commits per step, sorted [(generation offset, token)], and the batch."""
    batch = stepper(lm.decoder, prompts, cfg)
    steps = []
    for event in batch.events():
        if isinstance(event, StepEvent):
            c = event.committed[0]
            steps.append(sorted((int(p), int(t)) for p, t in zip(event.positions[0][c], event.tokens[0][c])))
    return steps, batch


def theirs(lm, prompt, cfg):
    """The transcription's commits per forward, its empty (zero-commit) forwards, canvas, NFE, exit."""
    record = []
    canvas, nfe, exit_at = prophet_generate(
        lm, torch.tensor([prompt]), lm.decoder.encode, gen_length=cfg.gen_len, block_length=cfg.block_len,
        steps=cfg.total_steps, anchor=cfg.answer_anchor, mask_id=lm.specials.mask, cache=cfg.cache,
        thresholds=(cfg.prophet_early, cfg.prophet_mid, cfg.prophet_late), record=record)
    return record, canvas[0, len(prompt):], nfe, exit_at


# (cache, phase): no cache tests every step, the caches only each block's first (full) forward
CASES = [("none", "never"), ("none", "early"), ("none", "mid"), ("none", "late"),
         ("prefix", "never"), ("dual", "never"), ("prefix", "cached"), ("dual", "cached")]
FIRST = {"early": 2, "mid": 11, "late": 22, "cached": 17}        # the phase's first global step (of 32)


@pytest.mark.parametrize("cache, phase", CASES)
@pytest.mark.parametrize("fixture, boundary", [("llada64", False), ("llada64", True), ("llada64_heavy_mask", False)])
def test_step_by_step_equal_to_the_transcription(fixture, boundary, cache, phase, request):
    """Same commits (positions and tokens, the exit's fill included) per step, same exit, same
    canvas, same NFE; the anchors leave block 2 six masks short of its 16 steps, and the
    transcription's zero-commit steps there (forwards that commit nothing) are the only difference."""
    lm = request.getfixturevalue(fixture)
    prompt = prompt_of(lm, boundary)
    assert (len(prompt) % 16 == 0) == boundary
    cfg = prophet_cfg(cache, PHASES[phase][boundary])
    our_steps, batch = ours(lm, [prompt], cfg)
    record, canvas, nfe, exit_at = theirs(lm, prompt, cfg)
    empty = sum(e for _, e in record)
    assert our_steps == [c for c, e in record if not e]
    assert batch.nfe == nfe - empty == len(our_steps)
    assert batch.canvas.host[0, len(prompt):].tolist() == canvas.tolist()
    fires = phase != "never"
    assert (exit_at is not None) == fires == bool(batch.prophet.exited[0])
    if fires:                                       # in its phase (block 2 starts at global step 17)
        assert batch.prophet.exit_nfe[0] == exit_at - empty == batch.nfe < 26
        assert FIRST[phase] <= (exit_at if cache == "none" else 17)
        assert len(our_steps[-1]) > 1                                  # the exit filled several masks


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_an_exit_in_a_skipped_empty_step(llada64, cache):
    """Documented divergence (docs/accelerators/prophet.md 3.4): anchors at offsets 2-4 leave block 1 three
    masks short of its 16 steps. The authors' zero-commit steps 14-16 see the canvas fastdllm's
    block-2 step 0 (their step 17) sees; their step 16 is already mid phase (16/48 >= 0.33) and
    exits there, fastdllm exits at step 17 (mid too) on the same logits: same fill, 2 forwards fewer."""
    prompt = prompt_of(llada64, False)
    cfg = prophet_cfg(cache, PHASES["mid"][False], anchor="2:The", gen_len=48)
    our_steps, batch = ours(llada64, [prompt], cfg)
    record, canvas, nfe, exit_at = theirs(llada64, prompt, cfg)
    assert batch.canvas.host[0, len(prompt):].tolist() == canvas.tolist()
    assert our_steps == [c for c, e in record if not e]
    if cache == "none":                                                # their steps 14, 15, 16 commit nothing
        assert [e for _, e in record[13:16]] == [True, True, False] and exit_at == 16
        assert batch.prophet.exit_nfe[0] == 14 == nfe - 2              # fastdllm: block 2, step 0 = step 17
    else:                                                              # no empty steps on the cache
        assert batch.prophet.exit_nfe[0] == exit_at == nfe == 14


def test_progress_of_a_check_is_their_global_step():
    """Block b, step i checks at their global step b * S + i + 1 of total_steps (S = 16, 48 steps)."""
    cfg = prophet_cfg("none", (3.0, 2.0, 1.0), gen_len=48)
    canvas = plan([[5, 6]], cfg, mask=0, pad=1, causal=False, context_length=64)
    state = Prophet(cfg, Decoder(None, SpecialTokens(0, 1, (2,)), str, 64, encode=lambda text: [9]), canvas, False, False)
    host = canvas.host
    T = canvas.length
    assert state.check(host, (0, T), 0, 14, 1).bar.tolist() == [3.0]   # step 15 of 48: early
    assert state.check(host, (0, T), 0, 15, 1).bar.tolist() == [2.0]   # step 16: mid
    assert state.check(host, (0, T), 2, 0, 1).bar.tolist() == [1.0]    # block 2's first: step 33, late
    assert state.check(host, (2, T), 0, 1, 1) is None                  # a cached step does not check


def test_dream_equal_to_the_transcription(dream64):
    """Dream's logit shift (position i from i - 1): the same gaps and fill, no cache."""
    prompt = dream64.encode(HEAVY_PROMPT, chat=True)
    for thresholds in (NEVER, (1e9, 1e9, 0.0)):
        cfg = prophet_cfg("none", thresholds)
        our_steps, batch = ours(dream64, [prompt], cfg)
        record, canvas, nfe, exit_at = theirs(dream64, prompt, cfg)
        assert our_steps == [c for c, e in record if not e]
        assert batch.canvas.host[0, len(prompt):].tolist() == canvas.tolist()
        assert (exit_at is not None) == bool(batch.prophet.exited[0]) == (thresholds != NEVER)


PROMPTS = ["Hi.", "Explain the block-wise KV cache in two sentences, please.", "What is 2 + 2?"]


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_left_padded_batch_equals_its_rows(llada64, cache):
    """Each row exits on its own gaps (theirs examines row 0 only): a left-padded batch commits,
    row by row, what each row commits alone, with rows exiting at different steps or not at all."""
    prompts = [llada64.encode(p, chat=True) for p in PROMPTS]
    assert len({len(p) for p in prompts}) == 3
    cfg = prophet_cfg(cache, (1.7, 1.4, 1.1) if cache == "none" else (1.3, 1.3, 1.3))
    together = stepper(llada64.decoder, prompts, cfg)
    events = [e for e in together.events() if isinstance(e, StepEvent)]
    exits = set()
    for row, prompt in enumerate(prompts):
        _, alone = ours(llada64, [prompt], cfg)
        assert together.canvas.host[row, -32:].tolist() == alone.canvas.host[0, -32:].tolist()
        mine = [sorted(e.positions[row][e.committed[row]].tolist()) for e in events if e.committed[row].any()]
        assert len(mine) == alone.nfe
        assert bool(together.prophet.exited[row]) == bool(alone.prophet.exited[0])
        exits.add(alone.prophet.exit_nfe[0])
    assert len(exits) > 1                                              # rows did exit at different steps


def test_threshold_rule_checks_at_refresh_steps_with_its_share_of_masks(llada64):
    """Beyond theirs: an adaptive rule's progress is the share of the row's masks decided (+1)."""
    prompt = prompt_of(llada64, False)
    cfg = prophet_cfg("dual", (1e9, 0.6, 1e9), rule="threshold", threshold=0.9)
    _, batch = ours(llada64, [prompt], cfg)
    assert bool(batch.prophet.exited[0]) and batch.prophet.masks.tolist() == [26]   # 32 less 6 anchor slots
    # block 2's first step: 16 of 26 decided, (16 + 1) / 26 = 0.65 is mid phase
    assert 1 < batch.prophet.exit_nfe[0] < ours(llada64, [prompt], replace(cfg, prophet=False))[1].nfe


def test_refusals_are_one_line(tmp_path, llada64):
    from fastdllm.checkpoints import loading
    from fastdllm.testing.tiny_gemma import write_diffusion_gemma

    gemma = loading.load(write_diffusion_gemma(tmp_path / "gemma", canvas_length=32, max_denoising_steps=4),
                         dtype="fp32")
    cfg = DecodeConfig(gen_len=32, block_len=32, rule="threshold", prophet=True, answer_anchor=ANCHOR)
    with pytest.raises(UserError) as error:
        run(gemma.decoder, [[5, 6, 7]], cfg)
    assert "prophet commits masked positions early; " in str(error.value) and "\n" not in str(error.value)
    mask = llada64.specials.mask
    with pytest.raises(UserError) as error:
        run(llada64.decoder, [[5, 6, mask, mask, 7]], replace(cfg, gen_len=32, block_len=16), holes=[(2, 4)])
    assert "a template with holes has none" in str(error.value) and "\n" not in str(error.value)


def test_cli_generate_with_the_prophet_profile(llada_dir):
    from typer.testing import CliRunner

    from fastdllm.cli.app import app

    r = CliRunner().invoke(app, ["generate", "-m", str(llada_dir), "-P", "prophet", "--json", "What is 2 + 2?"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    config = record["config"]
    assert record["profile"] == "prophet" and config["prophet"] and config["cache"] == "none"
    assert (config["answer_anchor"], config["gen_len"], config["block_len"], config["rule"]) == \
        ("200:The|201:answer|202:is", 256, 32, "fixed")
    assert (config["prophet_early"], config["prophet_mid"], config["prophet_late"]) == (7.5, 5.0, 2.5)
    assert 0 < record["nfe"] <= 256
