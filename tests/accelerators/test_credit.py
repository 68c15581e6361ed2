"""CreditDecoding (docs/accelerators/credit.md 4): the credit state on known logits, its one-line config
errors, and fastdllm in float64 step by step against tests/references/reference_credit.py (a transcription of
dInfer's credit decoder), batch 1 and left-padded batches, plus the `credit` profile on the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import HEAVY_PROMPT
from mask_heavy import max_mask_probability, prompt_of
from one_line import one_line_refusal
from reference_credit import credit_generate

from fastdllm.decode.config import ConfigError, DecodeConfig
from fastdllm.decode.credit import CreditTrace
from fastdllm.decode.engine import StepEvent, generate, run
from fastdllm.errors import UserError

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]   # tiny float64 ops (tests/conftest.py)

ALPHA, GAMMA, BETA = 0.7, 0.2, 0.8                  # dInfer's constants, DecodeConfig's defaults


# --- the state on known logits ---------------------------------------------------------------------

def known_logits(*rows):
    """(B, K, 4) float64 logits whose softmax is exactly the given probabilities per slot."""
    return torch.tensor(rows, dtype=torch.float64).log()


P1 = [0.5, 0.25, 0.125, 0.125]      # argmax 0, p 0.5
P2 = [0.125, 0.125, 0.25, 0.5]      # argmax 3, p 0.5
P3 = [0.25, 0.5, 0.125, 0.125]      # argmax 1, p 0.5
Q = [0.1, 0.2, 0.6, 0.1]            # argmax 2, p 0.6


def test_update_adds_p_to_the_gamma_at_candidates_only_and_transform_fuses():
    trace = CreditTrace(DecodeConfig(block_len=4, credit=True), batch=2)
    slots = torch.tensor([[2, 0], [3, 1]])               # logits rows in any order of block offsets
    candidate = torch.tensor([[True, False], [True, True]])
    logits = known_logits([P1, P2], [Q, P3])
    trace.update(slots, candidate, logits)
    expected = torch.zeros(2, 4, 4, dtype=torch.float64)
    expected[0, 2, 0] = 0.5 ** GAMMA                     # row 0, offset 2: its argmax 0
    expected[1, 3, 2] = 0.6 ** GAMMA                     # row 1, offset 3: argmax 2; row 0 offset 0: no candidate
    expected[1, 1, 1] = 0.5 ** GAMMA
    torch.testing.assert_close(trace.credit, expected, rtol=0, atol=1e-15)
    fused = trace.transform(slots, logits)
    torch.testing.assert_close(fused, logits + ALPHA * torch.log(expected[torch.arange(2)[:, None], slots] + 1),
                               rtol=0, atol=1e-15)
    assert fused[0, 1].tolist() == logits[0, 1].tolist()    # offset 0 has no credit: unchanged
    assert fused[0, 0, 0] > logits[0, 0, 0] and fused[0, 0, 1:].tolist() == logits[0, 0, 1:].tolist()

    # a second call decays everything by beta before adding this step's gains
    again = known_logits([P1, P1], [Q, Q])
    trace.update(torch.tensor([[2, 1], [3, 0]]), torch.ones(2, 2, dtype=torch.bool), again)
    expected *= BETA
    expected[0, 2, 0] += 0.5 ** GAMMA
    expected[0, 1, 0] += 0.5 ** GAMMA
    expected[1, 3, 2] += 0.6 ** GAMMA
    expected[1, 0, 2] += 0.6 ** GAMMA
    torch.testing.assert_close(trace.credit, expected, rtol=0, atol=1e-15)
    assert math.isclose(float(trace.credit[0, 2, 0]), 0.5 ** GAMMA * (1 + BETA), rel_tol=1e-15)


def test_reset_at_a_block_start_zeroes_the_credit_and_skips_the_first_decay():
    trace = CreditTrace(DecodeConfig(block_len=2, credit=True), batch=1)
    slots, candidate = torch.tensor([[0, 1]]), torch.ones(1, 2, dtype=torch.bool)
    for _ in range(3):
        trace.update(slots, candidate, known_logits([P1, Q]))
    assert float(trace.credit[0, 0, 0]) > 0.5 ** GAMMA
    trace.reset()
    assert not trace.credit.any() and trace.calls == 0
    trace.update(slots, candidate, known_logits([P2, Q]))
    expected = torch.zeros(1, 2, 4, dtype=torch.float64)
    expected[0, 0, 3], expected[0, 1, 2] = 0.5 ** GAMMA, 0.6 ** GAMMA    # this step's gains only, undecayed
    torch.testing.assert_close(trace.credit, expected, rtol=0, atol=1e-15)


def test_rows_are_independent_and_the_callers_logits_are_left_alone():
    cfg = DecodeConfig(block_len=2, credit=True)
    pair, alone = CreditTrace(cfg, batch=2), CreditTrace(cfg, batch=1)
    logits = known_logits([P1, Q], [P3, P2])
    copy = logits.clone()
    fused = pair(torch.tensor([[0, 1], [1, 0]]), torch.tensor([[True, True], [False, True]]), logits)
    solo = alone(torch.tensor([[0, 1]]), torch.tensor([[True, True]]), logits[:1])
    assert torch.equal(logits, copy)
    assert torch.equal(fused[:1], solo) and torch.equal(pair.credit[:1], alone.credit)


@pytest.mark.parametrize("dtype, work", [(torch.bfloat16, torch.float32), (torch.float32, torch.float32),
                                         (torch.float64, torch.float64)])
def test_credit_is_float32_or_better(dtype, work):
    trace = CreditTrace(DecodeConfig(block_len=2, credit=True), batch=1)
    logits = known_logits([P1, Q]).to(dtype)
    fused = trace(torch.tensor([[0, 1]]), torch.ones(1, 2, dtype=torch.bool), logits)
    assert trace.credit.dtype == work and fused.dtype == work
    assert trace.nbytes == 2 * 4 * trace.credit.element_size()


def test_a_batch_over_one_gib_of_credit_is_refused_in_one_line():
    cfg = DecodeConfig(block_len=64, gen_len=256, credit=True)
    CreditTrace(cfg, batch=32, vocab=126464)                            # 0.97 GiB: fine
    with pytest.raises(UserError) as error:
        CreditTrace(cfg, batch=64, vocab=126464)
    assert "1.93 GiB" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("values, message", [
    (dict(credit=True, edit_threshold=0.5), "credit: edit_threshold re-decides written tokens"),
    (dict(credit=True, rule="eb_sampler"), "credit accumulates over a masked block's steps"),
    (dict(credit_beta="1.5"), "credit_beta: 1.5 is above the maximum 1.0"),
    (dict(credit_beta="0"), "credit_beta: 0.0 must be greater than 0.0"),
    (dict(credit_alpha="-1"), "credit_alpha: -1.0 must be greater than 0.0"),
    (dict(credit_gamma="-0.5"), "credit_gamma: -0.5 is below the minimum 0.0"),
    (dict(credit="maybe"), "credit: expected bool, got 'maybe'"),
    (dict(credit_alpa="1"), "did you mean 'credit_alpha'"),
])
def test_config_errors_are_one_line(values, message):
    one_line_refusal(lambda: DecodeConfig.from_dict(values), message, ConfigError)


# --- fastdllm against the transcription, float64 ----------------------------------------------------

def ours(lm, prompt, cfg):
    """Per step the sorted [row, canvas position, token] of every commit, and the Result."""
    steps, result = [], None
    for event in generate(lm.decoder, [prompt], cfg):
        if isinstance(event, StepEvent):
            c = event.committed
            rows, at = c.nonzero()[:, 0], event.positions[c] + len(prompt)
            steps.append(sorted([int(r), int(p), int(t)] for r, p, t in zip(rows, at, event.tokens[c])))
        else:
            result = event
    return steps, result


def theirs(lm, prompt, cfg, **kw):
    record = []
    canvas, nfe = credit_generate(lm, torch.tensor([prompt]), cache=cfg.cache, gen_length=cfg.gen_len,
                                  block_length=cfg.block_len, threshold=cfg.threshold, mask_id=lm.specials.mask,
                                  alpha=cfg.credit_alpha, gamma=cfg.credit_gamma, beta=cfg.credit_beta,
                                  record=record, **kw)
    return record, canvas[0, len(prompt):], nfe


def credit_cfg(cache, threshold, **kw):
    return DecodeConfig(**{**dict(gen_len=32, block_len=16, cache=cache, rule="dinfer", threshold=threshold,
                                  credit=True, early_stop=False), **kw})


@pytest.mark.parametrize("align", ["prompt", "grid"])
@pytest.mark.parametrize("threshold", [0.8, 0.95])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("fixture, boundary", [("llada64", False), ("llada64", True), ("llada64_heavy_mask", False)])
def test_step_by_step_equal_to_dinfers_credit_decoder(fixture, boundary, cache, threshold, align, request):
    """The prefix/dual caches refresh at block entry and decide on that forward (theirs); no cache
    runs the whole canvas every step. Same commits (positions and tokens) per step, same NFE; blocks
    from the prompt's end (their library's default) and on the grid (their evaluation scripts'),
    prompts on and off the grid."""
    lm = request.getfixturevalue(fixture)
    prompt = prompt_of(lm, boundary)
    assert (len(prompt) % 16 == 0) == boundary
    cfg = credit_cfg(cache, threshold, block_align=align)
    our_steps, result = ours(lm, prompt, cfg)
    ref_steps, ref_canvas, ref_nfe = theirs(lm, prompt, cfg, grid=align == "grid")
    assert result.nfe == ref_nfe == len(our_steps)
    assert our_steps == ref_steps
    assert result.canvas[0].tolist() == ref_canvas.tolist()
    if fixture.endswith("heavy_mask"):  # the fixture does not hide the normaliser
        assert max_mask_probability(lm, prompt + [lm.specials.mask] * cfg.gen_len) > 0.05


@pytest.mark.parametrize("threshold", [0.8, 0.95])
def test_credit_changes_the_decisions(llada64, threshold):
    """The comparison above is not vacuous: the same run without credit commits differently."""
    prompt = prompt_of(llada64, False)
    with_credit, _ = ours(llada64, prompt, credit_cfg("dual", threshold))
    without, _ = ours(llada64, prompt, credit_cfg("dual", threshold, credit=False))
    assert with_credit != without


def test_a_missing_block_reset_would_be_seen(llada64, monkeypatch):
    """Credit is zeroed at every block start (their docstring: per block). Without the engine's
    reset block 2 would decide on block 1's decayed credit: the transcription tells them apart (in
    this setting; the leftover credit sits on block 1's tokens and changes a decision only now and then)."""
    prompt = prompt_of(llada64, False)
    cfg = credit_cfg("dual", 0.95)
    ref_steps, _, _ = theirs(llada64, prompt, cfg)
    monkeypatch.setattr(CreditTrace, "reset", lambda self: None)
    leaky, _ = ours(llada64, prompt, cfg)
    assert leaky != ref_steps


def test_no_credit_leaks_into_the_next_generation(llada64):
    """Decided against dInfer (docs/accelerators/credit.md 4.4): their matrices are cleared only when the
    canvas has no mask left, so an early-stopped generation leaves credit to the next one under the
    same block key. Here a generation after an early-stopped one equals the transcription's fresh one."""
    first = run(llada64.decoder, [llada64.encode("Hi.", chat=True)], credit_cfg("dual", 0.8, early_stop=True))
    assert first.nfe > 0
    prompt = prompt_of(llada64, False)
    cfg = credit_cfg("dual", 0.8)
    assert ours(llada64, prompt, cfg)[0] == theirs(llada64, prompt, cfg)[0]


def test_dinfers_own_mask_rule_agrees_on_these_fixtures(llada64_heavy_mask):
    """The transcription bans the mask id from the prediction (docs/specs/llada2-moe.md Q5); dInfer drops
    a position whose fused argmax is the mask id instead. On the mask-heavy fixture the two agree
    (the mask is never the fused argmax there), so the equality above holds for dInfer's own rule."""
    lm = llada64_heavy_mask
    prompt = prompt_of(lm, False)
    cfg = credit_cfg("dual", 0.8)
    assert theirs(lm, prompt, cfg, ban_mask=False)[0] == theirs(lm, prompt, cfg)[0]


PROMPTS = ["Hi.", "Explain the block-wise KV cache in two sentences, please.", "What is 2 + 2?"]


def row_steps(events, row):
    """One row's commits per block, empty steps left out: [(block, sorted positions)]."""
    out = []
    for event in events:
        if isinstance(event, StepEvent) and event.committed[row].any():
            out.append((event.block, sorted(event.positions[row][event.committed[row]].tolist())))
    return out


def test_the_grid_changes_only_a_prompt_off_it(llada64):
    """What makes the grid rows above mean something: off the grid the first block holds the
    prompt's tail and the commits differ from step 0; on it the two layouts are one."""
    for boundary, same in ((False, False), (True, True)):
        prompt = prompt_of(llada64, boundary)
        a, b = (ours(llada64, prompt, credit_cfg("dual", 0.8, block_align=align))[0] for align in ("prompt", "grid"))
        assert (a == b) is same and (a[0] == b[0]) is same


@pytest.mark.parametrize("align", ["prompt", "grid"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_left_padded_batch_equals_its_rows(llada64, cache, align):
    """Credit is per row: a left-padded batch commits, row by row, what each row commits alone,
    also where rows finish a block at different steps (dInfer's select_undecoded, which would
    reshape a shared matrix, is not needed: a finished row gains nothing and is never read again)."""
    prompts = [llada64.encode(p, chat=True) for p in PROMPTS]
    assert len({len(p) for p in prompts}) == 3
    cfg = credit_cfg(cache, 0.8, block_align=align)
    batch = list(generate(llada64.decoder, prompts, cfg))
    result = batch[-1]
    finish = set()                                       # (block, step at which each row's block filled)
    for row, prompt in enumerate(prompts):
        alone = list(generate(llada64.decoder, [prompt], cfg))
        assert result.canvas[row].tolist() == alone[-1].canvas[0].tolist()
        assert row_steps(batch, row) == row_steps(alone, 0)
        finish.add(tuple(max(e.step for e in alone if isinstance(e, StepEvent) and e.block == b) for b in (0, 1)))
    assert len(finish) > 1                               # rows did finish blocks at different steps


def test_other_rules_and_dream_read_the_fused_logits(llada64, dream64):
    """Beyond dInfer (threshold decoder only, LLaDA): credit composes with any rule and family; it
    commits every token and acts on the decisions."""
    for lm in (llada64, dream64):
        prompt = lm.encode(HEAVY_PROMPT, chat=True)
        for rule in (dict(rule="threshold", threshold=0.9), dict(rule="factor", factor=1.0)):
            cfg = DecodeConfig(gen_len=32, block_len=16, cache="dual", credit=True, early_stop=False, **rule)
            steps, result = ours(lm, prompt, cfg)
            assert result.committed == 32
            assert steps != ours(lm, prompt, DecodeConfig(**{**cfg.to_dict(), "credit": False}))[0]


def test_renoising_family_refused_in_one_line(tiny):
    from fastdllm.checkpoints import loading

    lm = loading.load(tiny("diffusion_gemma", canvas_length=16, max_denoising_steps=4), dtype="fp32")
    cfg = DecodeConfig(gen_len=16, block_len=16, rule="threshold", credit=True)
    with pytest.raises(UserError) as error:
        run(lm.decoder, [[5, 6, 7]], cfg)
    assert "credit accumulates over a masked block's steps" in str(error.value) and "\n" not in str(error.value)


def test_cli_generate_with_the_credit_profile(llada_dir):
    from typer.testing import CliRunner

    from fastdllm.cli.app import app

    r = CliRunner().invoke(app, ["generate", "-m", str(llada_dir), "-P", "credit", "-n", "64", "--json", "Hello"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["profile"] == "credit"
    config = record["config"]
    assert (config["credit"], config["rule"], config["threshold"], config["cache"], config["block_len"]) == \
        (True, "dinfer", 0.8, "dual", 64)
    assert (config["credit_alpha"], config["credit_gamma"], config["credit_beta"]) == (0.7, 0.2, 0.8)
    assert 0 < record["nfe"] <= 64
