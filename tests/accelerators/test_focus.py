"""FOCUS (docs/accelerators/focus.md) against the independent float64 transcription of its authors' decoder
(tests/references/reference_focus.py, sands-lab/FOCUS@277f1d1) on tiny SDAR and LLaDA2.0 checkpoints: per step
the processing set, the kept set and the commits; the final canvas; NFE. With nothing dropped and
the delayed cache off, FOCUS is the plain decode. A batch decodes each row as alone; serve's
scheduler too. Refusals in one line."""

from __future__ import annotations

import json

import pytest
import reference_blockdiff as ref_bd
import reference_focus as ref
import reference_moe as ref_moe
import torch
from cli_runner import invoke
from helpers import TASKS, scheduler_answers

from fastdllm.checkpoints import loading
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.decode.events import StepEvent
from fastdllm.decode.focus import Focus
from fastdllm.errors import UserError
from fastdllm.testing.tiny_blockdiff import write_sdar
from fastdllm.testing.tiny_sdar_moe import write_sdar_moe

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]


def prompt_of(length: int, seed: int, high: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, high, (length,), generator=g).tolist()


@pytest.fixture(scope="module")
def sdar(tmp_path_factory):
    path = write_sdar(tmp_path_factory.mktemp("ckpt") / "sdar16", block_size=16, n_layers=3)
    lm = loading.load(path, dtype="fp64")
    ref_bd.BANNED[:] = [lm.specials.mask]
    yield lm, ref.SDARLayers(ref_bd.NaiveQwen(path)), 16, 30000
    ref_bd.BANNED[:] = []


@pytest.fixture(scope="module")
def llada2(tiny):
    path = tiny("llada2_moe")
    lm = loading.load(path, dtype="fp64")
    ref_bd.BANNED[:] = [lm.specials.mask]
    yield lm, ref.LLaDA2Layers(ref_moe.NaiveLLaDA2(path)), 32, 4000
    ref_bd.BANNED[:] = []


@pytest.fixture(scope="module")
def sdar_moe(tmp_path_factory):
    """SDAR-30B-A3B's layout (Qwen3-MoE layers): no reference here, the plain decode only."""
    return loading.load(write_sdar_moe(tmp_path_factory.mktemp("ckpt") / "sdar-moe", block_size=16), dtype="fp64"), \
        None, 16, 30000


def config(block, alpha=1.5, threshold=0.8, gen_len=32, delayed=True, **kw) -> DecodeConfig:
    return DecodeConfig(gen_len=gen_len, block_len=block, cache="prefix", rule="dynamic", threshold=threshold,
                        early_stop=False, focus_alpha=alpha, focus_delayed=delayed, **kw)


def decode(lm, prompts, cfg, monkeypatch=None):
    """Per row its steps as (block, processing, kept, sorted [(position, token)]); stores; Result.
    The sets come from Focus.run_layers (block offsets)."""
    sets = []
    if monkeypatch is not None:
        inner = Focus.run_layers

        def spy(self, s, e, processing, masked, target, evict):
            kept, logits, order = inner(self, s, e, processing, masked, target, evict)
            sets.append((processing.clone(), kept.clone()))
            return kept, logits, order
        monkeypatch.setattr(Focus, "run_layers", spy)
    events = []
    result = run(lm.decoder, prompts, cfg, on_event=lambda e: events.append(e) if isinstance(e, StepEvent) else None)
    steps = [[] for _ in prompts]
    for n, e in enumerate(x for x in events if x.step >= 0):
        for row in range(len(prompts)):
            at = (e.positions[row] + len(prompts[row]))[e.committed[row]]
            if not len(at):
                continue
            offsets = lambda m: [int(j) for j in m[row].nonzero().flatten()]     # noqa: E731
            P, K = (offsets(sets[n][0]), offsets(sets[n][1])) if sets else (None, None)
            steps[row].append((e.block, P, K, sorted(zip(at.tolist(), e.tokens[row][e.committed[row]].tolist()))))
    return steps, sum(e.step < 0 for e in events), result


def reference(lm, m, prompt, block, alpha, threshold, gen_len, delayed=True):
    return ref.focus_generate(m, prompt, mask_id=lm.specials.mask, gen_length=gen_len, block_length=block,
                              threshold=threshold, alpha=alpha, delayed=delayed)


CASES = [(5, 1.5, 0.8, 32), (16, 1.0, 0.5, 48), (23, 2.5, 0.95, 32), (40, 1.0, 0.9, 32), (7, 1.5, 0.3, 48)]


@pytest.mark.parametrize("length, alpha, threshold, gen_len", CASES)
def test_sdar_decodes_as_the_authors(sdar, monkeypatch, length, alpha, threshold, gen_len):
    lm, m, block, high = sdar
    prompt = prompt_of(length, length, high)
    trace = reference(lm, m, prompt, block, alpha, threshold, gen_len)
    steps, stores, result = decode(lm, [prompt], config(block, alpha, threshold, gen_len), monkeypatch)
    assert steps[0] == [(st.block - length // block, st.processing, st.kept, st.committed) for st in trace.steps]
    assert result.canvas[0].tolist() == trace.canvas[len(prompt):len(prompt) + result.canvas.shape[1]]
    assert result.nfe == trace.nfe


@pytest.mark.parametrize("length, alpha, threshold", [(5, 1.5, 0.8), (33, 1.0, 0.6)])
def test_llada2_decodes_as_the_authors(llada2, monkeypatch, length, alpha, threshold):
    lm, m, block, high = llada2
    prompt = prompt_of(length, length, high)
    trace = reference(lm, m, prompt, block, alpha, threshold, 32)
    steps, stores, result = decode(lm, [prompt], config(block, alpha, threshold, 32), monkeypatch)
    assert steps[0] == [(st.block - length // block, st.processing, st.kept, st.committed) for st in trace.steps]
    assert result.canvas[0].tolist() == trace.canvas[len(prompt):len(prompt) + result.canvas.shape[1]]
    assert result.nfe == trace.nfe


def test_the_cases_drop_tokens_and_use_every_rule(sdar):
    """The SDAR cases drop masks, cache decoded tokens (P smaller than the block) and reach the
    rules past the top-k (a kept set wider than the target)."""
    lm, m, block, high = sdar
    traces = [reference(lm, m, prompt_of(n, n, high), block, a, t, g) for n, a, t, g in CASES[:3]]
    steps = [s for tr in traces for s in tr.steps]
    assert sum(tr.dropped for tr in traces) > 0
    assert any(len(s.processing) < block for s in steps)
    assert any(len(s.kept) < len(s.processing) for s in steps)


def test_positions_run_count_the_kept_sets(sdar, monkeypatch):
    """Result.positions_run (bench's pos/fwd) counts what FOCUS's layers ran: per step layers 0 and 1
    the processing set P, layers 2.. the kept set K (docs 5), read here from Focus.run_layers; a store
    pass its span. Not the block each step is given (the count before FOCUS was counted)."""
    lm, m, block, high = sdar
    layers = len(lm.decoder.model.blocks)
    sets, inner = [], Focus.run_layers

    def spy(self, s, e, processing, masked, target, evict):
        kept, logits, order = inner(self, s, e, processing, masked, target, evict)
        sets.append((int(processing.sum()), int(kept.sum())))
        return kept, logits, order
    monkeypatch.setattr(Focus, "run_layers", spy)
    events = []
    result = run(lm.decoder, [prompt_of(5, 5, high)], config(block, gen_len=48), on_event=events.append)
    steps = [e for e in events if isinstance(e, StepEvent)]
    stores = sum(e.span[1] - e.span[0] for e in steps if e.step < 0)
    assert len(sets) == sum(e.step >= 0 for e in steps) and any(k < p for p, k in sets)
    assert result.positions_run == pytest.approx(stores + sum((2 * p + (layers - 2) * k) / layers for p, k in sets))
    assert result.positions_run < sum(e.span[1] - e.span[0] for e in steps)        # the spans: the old count


@pytest.mark.parametrize("family", ["sdar", "llada2", "sdar_moe"])
def test_nothing_dropped_is_the_plain_decode(request, family):
    """alpha so large that no mask is dropped, the delayed cache off: every step recomputes the
    whole block with every query, which is the plain prefix-cache decode (tokens and NFE)."""
    lm, _, block, high = request.getfixturevalue(family)
    prompts = [prompt_of(n, n, high) for n in (5, 19, 40)]
    plain = run(lm.decoder, prompts, config(block, None, gen_len=2 * block))
    kept_all = run(lm.decoder, prompts, config(block, 1e9, gen_len=2 * block, delayed=False))
    assert kept_all.canvas.tolist() == plain.canvas.tolist() and kept_all.nfe == plain.nfe
    delayed = run(lm.decoder, prompts, config(block, 1e9, gen_len=2 * block))
    assert delayed.canvas.shape == plain.canvas.shape          # the delayed cache alone: its own approximation


def test_batch_equals_rows_alone(sdar):
    lm, _, block, high = sdar
    prompts = [prompt_of(n, n, high) for n in (5, 40, 23)]
    batch = decode(lm, prompts, config(block, gen_len=48))
    for row, prompt in enumerate(prompts):
        alone = decode(lm, [prompt], config(block, gen_len=48))
        assert [s[3] for s in batch[0][row]] == [s[3] for s in alone[0][0]]
        assert batch[2].canvas[row, :alone[2].canvas.shape[1]].tolist() == alone[2].canvas[0].tolist()


def test_refusals(sdar, tiny, llada_dir):
    lm, _, block, high = sdar
    for bad, match in (({"cache": "dual"}, "needs cache prefix"), ({"rule": "klass"}, "rule klass is not combined"),
                       ({"sub_block_len": 8}, "not combined with sub_block_len"), ({"credit": True}, "credit")):
        with pytest.raises(Exception, match=match):
            DecodeConfig(**{"gen_len": 32, "block_len": 16, "cache": "prefix", "focus_alpha": 1.5, **bad})
    with pytest.raises(Exception, match="below the minimum 1.0"):
        DecodeConfig(focus_alpha=0.5)
    prompt = prompt_of(5, 5, high)
    llada = loading.load(llada_dir, dtype="fp64")
    v2 = loading.load(tiny("fast_dllm_v2"), dtype="fp64")
    routed = loading.load(tiny("llada2_2"), dtype="fp64")
    for model, match in ((llada, "attends bidirectional"), (v2, "from the slot before it"),
                         (routed, "block routing")):
        with pytest.raises(UserError, match=match):
            run(model.decoder, [prompt], config(32))


def test_profile_cli_and_serve(sdar):
    """The focus profile; generate --focus-alpha; the scheduler's answers equal each row alone."""
    from fastdllm.decode import profiles

    lm, _, block, high = sdar
    cfg = profiles.resolve(profiles.find("focus"), {})
    assert (cfg.focus_alpha, cfg.block_len, cfg.threshold, cfg.rule, cfg.cache) == (1.5, 32, 0.8, "dynamic", "prefix")
    record = json.loads(invoke("generate", "-m", lm.path, "--json", "-n", "32", "--block-len", "16", "--cache",
                               "prefix", "--focus-alpha", "1.5", "--no-early-stop", "--raw", "hi").stdout)
    assert record["config"]["focus_alpha"] == 1.5 and record["nfe"] > 0
    cfg = config(block, gen_len=48)
    prompts = {f"r{n}": prompt_of(n, n, high) for n in (9, 33, 40)}
    got = scheduler_answers(lm.decoder, prompts, cfg)
    for name, prompt in prompts.items():
        assert got[name].ids == run(lm.decoder, [prompt], cfg).ids[0]


@pytest.mark.slow
def test_chat_answers_as_generate_and_eval_scores_focus_beside_the_baseline(sdar, tmp_path):
    lm = sdar[0]
    flags = ("-m", lm.path, "--dtype", "fp64", "-P", "focus", "-n", "32", "--block-len", "16")
    chat = invoke("chat", *flags, input="Hello there\n/bye\n")
    generated = invoke("generate", *flags, "--json", "Hello there")
    assert chat.exit_code == 0 and generated.exit_code == 0, chat.stderr + generated.stderr
    assert chat.stdout == json.loads(generated.stdout)["text"] + "\n"          # stdout holds the answer only
    out = tmp_path / "r.json"
    scored = invoke("eval", "-m", lm.path, "--dtype", "fp64", "--include-path", TASKS, "--tasks", "tiny_next_line",
                    "--profiles", "baseline,focus", "--limit", "2", "--output", out)
    assert scored.exit_code == 0, scored.stderr
    baseline, focus = json.loads(out.read_text())
    assert focus["profile"] == "focus" and focus["config"]["focus_alpha"] == 1.5 and focus["answers"] == 2
    assert 0 < focus["nfe_per_answer"] < baseline["nfe_per_answer"]
