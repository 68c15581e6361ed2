"""Fast-dLLM++'s Frechet rule (docs/accelerators/frechet.md 6.4): fastdllm's count against
tests/references/reference_frechet.py (a transcription of the authors' `get_transfer_index_frechet_profile`)
on random and hand-made confidences, the equal-confidence case against the factor rule, its
config, and whole float64 decodes step by step against the transcription's block loop, on the
host path and on the device step."""

from __future__ import annotations

import pytest
import torch
from conftest import HEAVY_PROMPT
from device_batches import BATCHES, assert_same, decode, prompts_of
from reference_frechet import frechet_generate, frechet_select

from fastdllm.decode.config import ConfigError, DecodeConfig
from fastdllm.decode.device_step import DeviceStep
from fastdllm.decode.engine import StepEvent, run
from fastdllm.decode.rules import describe, rule_fields, rule_text
from fastdllm.decode.selection import select

T, F = True, False
MARGINS = (0.0, 0.02, 0.1, 0.25, 0.5, 0.9, 1.0)


def ours(conf, mask, margin, rule="frechet", **kw):
    return select(conf, mask, DecodeConfig(rule=rule, frechet_margin=margin, **kw))


def pick(conf, margin=0.25, cand=None):
    conf = torch.tensor(conf, dtype=torch.float64)
    cand = torch.ones_like(conf, dtype=torch.bool) if cand is None else torch.tensor(cand)
    return ours(conf, cand, margin).tolist()


# --- the count on hand-made confidences ------------------------------------------------------------

def test_a_heterogeneous_profile_commits_more_than_the_factor_rule():
    conf = [0.99, 0.95, 0.9, 0.85, 0.8, 0.75, 0.5]
    # scores (cum - (n-1)) - (1 - c_n): 0.98, 0.89, 0.74, 0.54, 0.29, -0.01, ...: five clear 0.25
    assert pick([conf]) == [[T, T, T, T, T, F, F]]
    # the factor rule at f = 1 - 0.25 stops at n = 3 (5 x 0.15 = 0.75 is not < 0.75)
    factor = select(torch.tensor([conf], dtype=torch.float64), torch.ones(1, 7, dtype=torch.bool),
                    DecodeConfig(rule="factor", factor=0.75))
    assert factor.sum().item() == 3
    # a margin of 0.3 drops the fifth (0.29), 0.0 keeps five (-0.01 fails)
    assert sum(pick([conf], 0.3)[0]) == 4 and sum(pick([conf], 0.0)[0]) == 5


def test_strictly_greater_at_least_one_and_candidates_only():
    # 0.75, 0.75: n = 2 scores (1.5 - 1) - 0.25 = 0.25, not > 0.25 (exact in binary)
    assert pick([[0.75, 0.75]]) == [[T, F]]
    assert pick([[0.75, 0.75]], 0.125) == [[T, T]]
    assert pick([[0.1, 0.05]]) == [[T, F]]                            # the best one even when all fail
    assert pick([[0.2, 0.99, 0.98]], cand=[[T, F, T]]) == [[F, F, T]]   # never a non-candidate
    assert pick([[0.5, 0.9]], cand=[[F, F]]) == [[F, F]]                # a row with no candidate
    assert pick([[1.0, 1.0, 1.0, 1.0]], 0.99) == [[T, T, T, T]]         # all certain: every score is 1
    assert pick([[1.0, 1.0, 1.0]], 1.0) == [[T, F, F]]                  # ... never > 1


def test_config_field_and_labels():
    cfg = DecodeConfig(rule="frechet")
    assert cfg.frechet_margin == 0.25                                   # their tables' delta
    assert describe(cfg) == "frechet margin 0.25" and rule_text(rule_fields(cfg)) == "fr>0.25"
    for bad, why in ((-0.1, "below the minimum 0.0"), (1.5, "above the maximum 1.0")):
        with pytest.raises(ConfigError, match=why):
            DecodeConfig(rule="frechet", frechet_margin=bad)
    with pytest.raises(ConfigError, match="the frechet rule needs prob or margin"):
        DecodeConfig(rule="frechet", confidence="neg_entropy")
    assert DeviceStep.applies(cfg, causal=False)


# --- against the transcription, many rows at once --------------------------------------------------

def random_rows(gen: torch.Generator, B: int, L: int):
    """(confidence (B, L) float64, mask (B, L) bool): rows with different mask counts (none, one, all)
    and profiles of several shapes: uniform, near-certain, coarse values with ties, exact 1.0s."""
    kind = int(torch.randint(4, (), generator=gen))
    u = torch.rand(B, L, generator=gen, dtype=torch.float64)
    conf = [u, 1 - u ** 4 * 0.3, torch.round(u * 8) / 8, torch.where(u < 0.4, 1.0, u)][kind]
    counts = torch.randint(L + 1, (B,), generator=gen)
    counts[0] = L
    if B > 1:
        counts[1] = 1
    order = torch.rand(B, L, generator=gen).argsort(-1)
    mask = order < counts[:, None]                                      # counts[b] masked slots, anywhere
    return conf, mask


def test_equal_to_the_transcription_on_random_rows():
    gen = torch.Generator().manual_seed(0)
    equal = total = parallel = 0
    for case in range(400):
        B, L = int(torch.randint(1, 5, (), generator=gen)), int(torch.randint(1, 41, (), generator=gen))
        conf, mask = random_rows(gen, B, L)
        margin = MARGINS[case % len(MARGINS)] if case % 3 else float(torch.rand((), generator=gen))
        mine, theirs = ours(conf, mask, margin), frechet_select(conf, mask, margin)
        equal += int(torch.equal(mine, theirs))
        total += 1
        parallel += int((mine.sum(-1) > 1).any())
    print(f"frechet count vs the transcription: {equal}/{total} batches equal")
    assert equal == total
    assert parallel > total // 3                                        # the cases do commit several


@pytest.mark.parametrize("margin", [0.0, 0.125, 0.25, 0.5])
def test_equal_confidences_are_the_factor_rule(margin):
    """c_1 = .. = c_K = 1 - eps: score_n = 1 - (n+1) eps, so score_n > margin is the factor rule's
    (n+1)(1 - c_n) < f at f = 1 - margin. Dyadic eps: both sides exact."""
    equal = total = 0
    for K in (1, 2, 5, 17, 40):
        for k in range(0, 65):
            conf = torch.full((1, K), 1 - k / 64, dtype=torch.float64)
            mask = torch.ones(1, K, dtype=torch.bool)
            n = ours(conf, mask, margin).sum().item()
            factor = select(conf, mask, DecodeConfig(rule="factor", factor=1 - margin)).sum().item() if margin < 1 else 1
            equal += int(n == factor == frechet_select(conf, mask, margin).sum().item())
            total += 1
    print(f"equal confidences, margin {margin}: {equal}/{total} equal to factor {1 - margin}")
    assert equal == total


def test_a_batch_of_rows_with_different_mask_counts():
    conf = torch.tensor([[0.99, 0.98, 0.97, 0.96, 0.2], [0.99, 0.98, 0.97, 0.96, 0.2], [0.6, 0.9, 0.5, 0.4, 0.3]],
                        dtype=torch.float64)
    mask = torch.tensor([[T, T, T, T, T], [F, T, F, F, F], [T, T, F, F, F]])
    mine = ours(conf, mask, 0.25)
    assert mine.tolist() == [[T, T, T, T, F], [F, T, F, F, F], [F, T, F, F, F]]
    assert torch.equal(mine, frechet_select(conf, mask, 0.25))


# --- whole decodes ---------------------------------------------------------------------------------

def commits_per_step(lm, prompts, cfg):
    steps = []

    def on_event(event):
        if isinstance(event, StepEvent):
            rows = event.committed.nonzero()[:, 0]
            picked = event.positions[event.committed] + len(prompts[0])
            steps.append(sorted([int(r), int(c)] for r, c in zip(rows, picked)))

    return steps, run(lm.decoder, prompts, cfg, on_event=on_event)


@pytest.mark.parametrize("margin", [0.25, 0.05])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("fixture", ["llada64", "dream64"])
def test_decode_step_by_step_equal_to_the_transcription(fixture, cache, margin, request, one_thread):
    lm = request.getfixturevalue(fixture)
    prompt = lm.encode(HEAVY_PROMPT, chat=True)
    prompts = [prompt, prompt[:2] + prompt[3:] + prompt[2:3]]          # two rows of one length: no padding
    cfg = DecodeConfig(gen_len=32, block_len=8, cache=cache, rule="frechet", frechet_margin=margin, early_stop=False)
    steps, result = commits_per_step(lm, prompts, cfg)
    record = []
    canvas, nfe = frechet_generate(lm, torch.tensor(prompts), cache=cache, gen_length=32, block_length=8,
                                   margin=margin, mask_id=lm.specials.mask, record=record)
    print(f"{fixture} {cache} margin {margin}: {sum(a == b for a, b in zip(steps, record))}/{len(record)} steps "
          f"equal, NFE {result.nfe} / {nfe}")
    assert (steps, result.nfe) == ([sorted(s) for s in record], nfe)
    assert result.canvas.tolist() == canvas[:, len(prompt):].tolist()
    assert max(sum(r == row for r, _ in step) for step in steps for row in (0, 1)) > 1   # a row commits several


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_device_step_equals_the_host_path(cache, llada64, monkeypatch, one_thread):
    prompts = prompts_of(llada64, BATCHES["padded"])
    cfg = DecodeConfig(gen_len=24, block_len=8, cache=cache, rule="frechet", frechet_margin=0.1, early_stop=False)
    host = decode(llada64, prompts, cfg, monkeypatch, full_block=False, on_device=False)
    assert_same(host, decode(llada64, prompts, cfg, monkeypatch, full_block=True, on_device=True))
    assert max(len(row) for s in host[0] for row in s[3]) > 1
