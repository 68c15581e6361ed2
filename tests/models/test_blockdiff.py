"""Block-diffusion families (SDAR, Fast-dLLM v2) on tiny checkpoints in the published formats.
Fast-dLLM v2 against the independent transcription of its reference decoder
(tests/references/reference_blockdiff.py), float64: the same committed (position, token) pairs at
every step, the same first token of every block, the same NFE; SDAR's own cases are in the
exactness runner (tests/references/test_exactness.py). A batch equal to its rows alone, early stop,
the CLI, quantization."""

from __future__ import annotations

import pytest
import reference_blockdiff as ref
from cli_runner import invoke
from helpers import QWEN_IDS, prompt_of
from block_families import block_steps, heavy

from fastdllm.checkpoints import loading
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import generate
from fastdllm.decode.events import Result, StepEvent


pytestmark = pytest.mark.sweep   # each test's first case in the fast lane, the rest in the full suite (tests/conftest.py)


@pytest.fixture(scope="module", autouse=True)
def reference_bans_nothing(one_thread):
    ref.BANNED[:] = []


@pytest.fixture(scope="module")
def sdar(tiny):
    path = tiny("sdar")
    return loading.load(path, dtype="fp64"), ref.NaiveQwen(path)


@pytest.fixture(scope="module")
def v2(tiny):
    path = tiny("fast_dllm_v2")
    return loading.load(path, dtype="fp64"), ref.NaiveQwen(path)


@pytest.fixture(scope="module")
def v2_heavy_mask(v2, tmp_path_factory):
    return heavy(v2[0], ref.NaiveQwen, tmp_path_factory, prompt_of(33, seed=1, **QWEN_IDS) + [v2[0].specials.mask] * 64)


@pytest.mark.parametrize("length", [31, 32, 33, 63])
@pytest.mark.parametrize("cache", ["prefix", "none", "dual"])
def test_fast_dllm_v2_decodes_as_the_reference(v2, length, cache):
    check_v2(*v2, length, cache)


@pytest.mark.parametrize("length", [4, 33])
@pytest.mark.parametrize("cache", ["prefix", "none", "dual"])
def test_fast_dllm_v2_with_a_probable_mask_decodes_as_the_reference(v2_heavy_mask, length, cache):
    check_v2(*v2_heavy_mask, length, cache, seed=0)


def check_v2(lm, naive, length, cache, seed=1):
    ref.BANNED[:] = [lm.specials.mask]
    prompt = prompt_of(length, seed=seed, **QWEN_IDS)
    cfg = DecodeConfig(gen_len=64, block_len=32, sub_block_len=8, rule="dynamic", threshold=0.7,
                       cache=cache, early_stop=False)
    steps, stored, result = block_steps(lm, [prompt], cfg)
    blocks = -(-(length + 64) // 32) - length // 32            # ours: up to the block holding token 64
    trace = ref.v2_generate(naive, prompt, mask_id=lm.specials.mask, stop_id=lm.specials.stops[0],
                            max_new_tokens=32 * blocks, threshold=0.7, use_block_cache=cache == "dual")
    assert not trace.stopped
    assert steps[0] == [pairs for _, pairs in trace.steps if pairs]
    assert stored[0] == trace.ar_tokens                        # every block's first token, from the block before
    assert result.nfe == trace.nfe
    assert result.canvas[0].tolist() == trace.canvas[length:]
    if cache == "dual":
        assert trace.partial > 0                               # the sub-block cache was exercised


@pytest.mark.parametrize("family, lengths, cfg", [
    ("sdar", [3, 11, 6], DecodeConfig(gen_len=16, block_len=4, rule="dynamic", threshold=0.7, early_stop=False)),
    ("v2", [33, 31, 64], DecodeConfig(gen_len=64, block_len=32, sub_block_len=8, rule="dynamic", threshold=0.7,
                                      early_stop=False)),
])
@pytest.mark.parametrize("cache", ["prefix", "none"])
def test_a_batch_decodes_each_row_as_alone(request, family, lengths, cfg, cache):
    lm, _ = request.getfixturevalue(family)
    cfg = DecodeConfig.from_dict({"cache": cache}, cfg)
    prompts = [prompt_of(n, seed=i, **QWEN_IDS) for i, n in enumerate(lengths)]
    _, _, batch = block_steps(lm, prompts, cfg)
    for row, prompt in enumerate(prompts):
        _, _, alone = block_steps(lm, [prompt], cfg)
        assert batch.ids[row] == alone.ids[0]
        assert batch.canvas[row, :alone.canvas.shape[1]].tolist() == alone.canvas[0].tolist()


def test_early_stop_ends_at_the_stop_token_mid_block(v2, monkeypatch):
    lm, _ = v2
    prompt = prompt_of(33, seed=1, **QWEN_IDS)
    cfg = DecodeConfig(gen_len=64, block_len=32, sub_block_len=8, rule="dynamic", threshold=0.7, early_stop=False)
    _, _, full = block_steps(lm, [prompt], cfg)
    stop_token = full.canvas[0, 5].item()                      # pretend the 6th token ends the answer
    stop_at = full.canvas[0].tolist().index(stop_token)
    stopped = lm.decoder.__class__(lm.model, lm.specials.__class__(
        mask=lm.specials.mask, pad=lm.specials.pad, stops=(stop_token,)), lm.detokenize, lm.context_length)
    events = list(generate(stopped, [prompt], DecodeConfig.from_dict({"early_stop": True}, cfg)))
    result = events[-1]
    assert result.ids[0] == full.canvas[0, :stop_at].tolist()  # the answer up to its stop, unchanged
    assert result.nfe < full.nfe and result.early_stopped


def test_sdar_entropy_bounded_fills_every_block(sdar):
    """No reference exists (the published rule raises); the rule as intended: each step commits the
    lowest-entropy masks whose entropies add up to less than the budget (at least one)."""
    lm, _ = sdar
    cfg = DecodeConfig(gen_len=16, block_len=4, rule="entropy_bounded", confidence="neg_entropy",
                       entropy_budget=1.0, early_stop=False)
    events = list(generate(lm.decoder, [prompt_of(5, **QWEN_IDS)], cfg))
    steps = [e for e in events if isinstance(e, StepEvent) and e.step >= 0]
    for e in steps:
        spent = -e.confidences[0][e.committed[0]]
        assert int(e.committed[0].sum()) == 1 or float(spent.sum()) < 1.0
    result = events[-1]
    assert (result.canvas[0] != lm.specials.mask).all() and len(result.ids[0]) == 16
    assert any(int(e.committed[0].sum()) > 1 for e in steps)     # the budget lets several through


# --- the families in the CLI -------------------------------------------------------------------------

@pytest.mark.parametrize("family, profile, block", [("sdar", "sdar", 4), ("v2", "fast-dllm-v2", 32)])
def test_generate_uses_the_family_profile_and_info_says_block_causal(request, family, profile, block):
    import json

    lm, _ = request.getfixturevalue(family)
    record = json.loads(invoke("generate", "-m", lm.path, "--json", "-n", "32", "--raw", "def f(x):").stdout)
    assert record["profile"] == profile and record["config"]["block_len"] == block
    assert record["config"]["rule"] == "dynamic" and record["model"]["attention"] == f"block-causal({block})"
    assert record["nfe"] >= 1 and len(record["ids"]) <= 32 + block
    assert "dynamic" in invoke("profiles", "show", profile, "--resolved", "-m", lm.path).stdout
    info = json.loads(invoke("info", lm.path, "--json").stdout)
    assert info["mask_id"] == lm.specials.mask and info["family"] == lm.family and info["chat_template"] is True
    assert info["end_of_turn_id"] == 151645                     # <|im_end|>, found from the chat template


def test_bench_baseline_uses_the_family_block(sdar):
    import json

    lm, _ = sdar
    r = invoke("bench", "-m", lm.path, "-n", "16", "-c", "baseline,prefix+parallel", "--n-prompts", "1",
            "--warmup", "0", "-r", "1", "-o", "jsonl")
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert {row["block_len"] for row in rows} == {4} and rows[0]["config"] == "baseline"
    assert rows[0]["tokens_per_forward"] < 1.0                  # one token per step, plus store passes


def test_formats_not_supported_yet_are_named(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llada2_moe_veomni"}))
    r = invoke("generate", "-m", tmp_path, "hi")
    assert r.exit_code == 1 and "LLaDA2's training format" in r.stderr and "is not supported yet" in r.stderr
    assert "sdar_moe" in r.stderr and "Fast_dLLM_Qwen" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("quantize", ["8bit", "4bit"])
def test_quantized_block_causal_families_on_cpu(sdar, quantize):
    import json

    lm, _ = sdar
    r = invoke("generate", "-m", lm.path, "--json", "-n", "8", "--raw", "--dtype", "bf16", "--quantize", quantize, "hi")
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["model"]["quantize"] == quantize and record["nfe"] >= 2 and len(record["ids"]) <= 8
