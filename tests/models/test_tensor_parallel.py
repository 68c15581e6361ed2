"""Tensor parallel (docs/specs/tensor-parallel.md): two ranks on gloo commit the same tokens with the
same NFE as one process in float64, for cache modes none / prefix / dual, under the default decision
(each rank's (max, argmax, logsumexp)) and under decisions that gather the rows, for LLaDA
(bidirectional), SDAR (block-causal) and LLaDA-MoE (expert parallel); that decision equals the gathered-rows one on the same
logits; each refusal is one line."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runner import invoke
from helpers import QWEN_IDS, prompt_of
from one_line import one_line_refusal

from fastdllm.checkpoints import loading, tensor_parallel
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.decode.selection import predict
from fastdllm.decode.split_head import combine, local_numbers
from fastdllm.errors import UsageError
from fastdllm.models.tensor_parallel import Ranks
from fastdllm.testing.tensor_parallel import decode_cases, run_ranks
from fastdllm.testing.tiny_moe import write_llada_moe

BASE = dict(gen_len=32, block_len=8, threshold=0.7)
# (name, DecodeConfig fields, whether each step decides from the ranks' three numbers)
CASES = [(f"{cache}-{name}", dict(BASE, cache=cache, **fields), split)
         for cache in ("none", "prefix", "dual")
         for name, fields, split in (("threshold-prob", {}, True), ("threshold-margin", {"confidence": "margin"}, False))]
CASES += [("dual-fixed-prob", dict(BASE, cache="dual", rule="fixed", steps=16), True),
          ("dual-sampled", dict(BASE, cache="dual", temperature=0.7, seed=3), False)]
# SDAR's authors take their softmax in the logits' dtype (authors_softmax): its steps gather the rows
SDAR = dict(gen_len=16, block_len=4, rule="dynamic", threshold=0.7, early_stop=False)
SDAR_CASES = [(f"sdar-{cache}-dynamic", dict(SDAR, cache=cache), False) for cache in ("none", "prefix", "dual")]
SDAR_CASES += [("sdar-prefix-fixed", dict(SDAR, cache="prefix", rule="fixed", steps=8), False)]
# LLaDA-MoE (its second fixture: a dense layer, a shared expert, the router's bias): experts split by rank
MOE = dict(gen_len=16, block_len=8, threshold=0.7)
MOE_CASES = [(f"moe-{cache}-threshold", dict(MOE, cache=cache), False) for cache in ("none", "prefix", "dual")]


@pytest.fixture(scope="module")
def prompts(llada64):
    return [llada64.encode("Write a function that adds two numbers.", chat=True), llada64.encode("Hi", chat=True)]


@pytest.fixture(scope="module")
def two_ranks(llada_dir, prompts, tmp_path_factory):
    return run_ranks(llada_dir, [c for _, c, _ in CASES], prompts, tmp_path_factory.mktemp("tp") / "ranks.json")


@pytest.fixture(scope="module")
def sdar_dir(tiny):
    return tiny("sdar")


@pytest.fixture(scope="module")
def sdar64(sdar_dir):
    return loading.load(sdar_dir, dtype="fp64")


@pytest.fixture(scope="module")
def sdar_prompts():
    return [prompt_of(11, seed=0, **QWEN_IDS), prompt_of(6, seed=1, **QWEN_IDS)]


@pytest.fixture(scope="module")
def sdar_ranks(sdar_dir, sdar_prompts, tmp_path_factory):
    return run_ranks(sdar_dir, [c for _, c, _ in SDAR_CASES], sdar_prompts, tmp_path_factory.mktemp("tp") / "sdar.json")


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return write_llada_moe(tmp_path_factory.mktemp("ckpt") / "tiny-llada-moe", num_key_value_heads=2,
                           shared_expert_intermediate_size=48, moe_layer_freq=[0, 1], moe_router_enable_expert_bias=True)


@pytest.fixture(scope="module")
def moe_prompts():
    return [prompt_of(11, seed=0, low=10, high=200), prompt_of(6, seed=1, low=10, high=200)]


@pytest.fixture(scope="module")
def moe_ranks(moe_dir, moe_prompts, tmp_path_factory):
    return run_ranks(moe_dir, [c for _, c, _ in MOE_CASES], moe_prompts, tmp_path_factory.mktemp("tp") / "moe.json")


@pytest.mark.slow          # processes: the full suite only (tests/conftest.py)
@pytest.mark.parametrize("index", range(len(CASES)), ids=[name for name, _, _ in CASES])
def test_two_ranks_commit_the_tokens_and_nfe_of_one_process(index, two_ranks, llada64, prompts, one_thread):
    same_as_one_process(CASES[index], two_ranks, index, llada64, prompts)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(SDAR_CASES)), ids=[name for name, _, _ in SDAR_CASES])
def test_two_ranks_of_a_block_causal_family_commit_as_one_process(index, sdar_ranks, sdar64, sdar_prompts, one_thread):
    same_as_one_process(SDAR_CASES[index], sdar_ranks, index, sdar64, sdar_prompts)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(MOE_CASES)), ids=[name for name, _, _ in MOE_CASES])
def test_two_ranks_of_an_moe_family_each_with_half_the_experts_commit_as_one_process(index, moe_ranks, moe_dir,
                                                                                   moe_prompts, one_thread):
    same_as_one_process(MOE_CASES[index], moe_ranks, index, loading.load(moe_dir, dtype="fp64"), moe_prompts)


def same_as_one_process(case, ranks, index, lm, prompts):
    name, fields, split = case
    one = decode_cases(lm, [fields], prompts)[0]
    got = ranks["results"][index]
    assert ranks["ranks_agree"]
    assert (got["canvas"], got["nfe"]) == (one["canvas"], one["nfe"])
    assert (got["split_decisions"] == got["nfe"]) if split else got["split_decisions"] == 0


@pytest.mark.parametrize("ranks", [2, 3])
def test_the_ranks_numbers_decide_as_the_gathered_rows(ranks):
    torch.manual_seed(0)
    B, K, V, mask = 3, 5, 37, 20
    logits = torch.randn(B, K, V, dtype=torch.float64) * 3
    logits[0, 0, mask] = 50.0                         # the mask id holds the row's max: never the token
    logits[1, 0, [4, 30]] = 40.0                      # the max on two ranks: the lower id wins
    logits[2, 1, :] = 1.0                             # a flat row: id 0 (the mask id not first)
    bounds = [r * V // ranks for r in range(ranks + 1)]
    numbers = torch.stack([local_numbers(logits[..., a:b], a, [mask]) for a, b in zip(bounds, bounds[1:])])
    tokens, confidence = combine(numbers)
    want_tokens, want_confidence = predict(logits, temperature=0.0, measure="prob", banned=[mask], generator=None)
    assert torch.equal(tokens, want_tokens)
    assert tokens[0, 0] != mask and tokens[1, 0] == 4 and tokens[2, 1] == 0
    torch.testing.assert_close(confidence, want_confidence, rtol=1e-13, atol=1e-15)


def test_a_family_without_a_split_table_is_refused(dream_dir):
    one_line_refusal(lambda: tensor_parallel.load(dream_dir, Ranks(0, 2), dtype="fp64"),
                     "tensor parallel is built for LLaDA, SDAR, LLaDA-MoE only; DreamModel is refused")


def test_heads_that_do_not_split_over_the_ranks_are_refused(llada_dir):
    one_line_refusal(lambda: tensor_parallel.load(llada_dir, Ranks(0, 3), dtype="fp64"),
                     "4 KV heads (n_kv_heads) do not split over 3 ranks")


@pytest.mark.parametrize("flags, message", [
    (["--quantize", "int8"], "--tp 2 with --quantize int8: the packed rows"),
    (["--device-map", "auto"], "--tp 2 with --device-map / --max-memory"),
    (["--suffix", "b"], "--tp 2: infilling"),
    (["--tp", "0"], "--tp 0: give at least 1"),
])
def test_flags_tensor_parallel_does_not_take_are_one_line(flags, message, llada_dir):
    result = invoke("generate", "-m", llada_dir, "--tp", "2", *flags, "a")
    assert result.exit_code == 2 and message in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1


@pytest.mark.parametrize("fields, message", [({"cache": "dllm_cache"}, "cache dllm_cache under tensor parallel"),
                                             ({"focus_alpha": 1.5, "cache": "prefix"}, "focus under tensor parallel")])
def test_decoding_that_reads_a_ranks_own_heads_is_refused(fields, message, llada_dir, prompts):
    lm = tensor_parallel.load(llada_dir, Ranks(0, 1), dtype="fp64")   # refused before any collective
    one_line_refusal(lambda: run(lm.decoder, prompts, DecodeConfig(**dict(BASE, **fields))), message)


@pytest.mark.slow          # processes: the full suite only
def test_generate_tp_2_prints_the_answer_of_one_process(llada_dir):
    args = ("generate", "-m", llada_dir, "--dtype", "fp64", "-n", "32", "--json", "def add(a, b):")
    one = json.loads(invoke(*args).stdout)
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "fastdllm", *map(str, args), "--tp", "2"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    two = json.loads(out.stdout)            # rank 0 alone prints: one JSON object
    assert (two["ids"], two["nfe"]) == (one["ids"], one["nfe"])
    assert two["model"]["tensor_parallel"] == {"rank": 0, "ranks": 2}


@pytest.mark.slow          # processes: the full suite only
def test_bench_tp_2_measures_the_rows_of_one_process(llada_dir, tmp_path):
    (tmp_path / "p.txt").write_text("def add(a, b):\nHello there\n")
    args = ("bench", "-m", llada_dir, "--dtype", "fp64", "-c", "baseline,dual", "-n", "32", "--prompts",
            tmp_path / "p.txt", "-r", "1", "--warmup", "0", "--format", "json")
    one = json.loads(invoke(*args).stdout)["records"]
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "fastdllm", *map(str, args), "--tp", "2"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    two = json.loads(out.stdout)["records"]            # rank 0 alone prints
    keys = ("config", "nfe", "answer_tokens", "generated_tokens", "agreement_tokens", "agreement_answers")
    assert [[r[k] for k in keys] for r in two] == [[r[k] for k in keys] for r in one]
    assert [r["tensor_parallel"] for r in two] == [2, 2] and "split over 2 tensor-parallel ranks" in out.stderr


@pytest.mark.slow          # processes: the full suite only
def test_serve_tp_2_answers_concurrent_requests_as_one_process(llada_dir):
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from serve_process import ServerProcess

    prompts = ["def add(a, b):", "Hello there", "import os"]

    def answers(*extra) -> tuple[list[str], int, str]:
        server = ServerProcess("-m", llada_dir, "--dtype", "fp64", *extra, startup_s=300)
        ask = lambda p: httpx.post(server.v1 + "/completions", timeout=300, json={   # noqa: E731
            "model": "tiny-llada", "prompt": p, "max_tokens": 32, "temperature": 0}).json()["choices"][0]["text"]
        with ThreadPoolExecutor(len(prompts)) as pool:              # together: they share batches
            texts = list(pool.map(ask, prompts))
        return texts, server.stop(), server.log

    one, _, _ = answers()
    two, code, log = answers("--tp", "2")
    assert two == one and len(set(one)) == len(prompts)
    assert code == 0 and "fastdllm serve: stopped" in log and "Traceback" not in log     # SIGTERM: a clean stop


@pytest.mark.parametrize("flags, message", [
    (["--num-processes", "2"], "--tp 2 with --num-processes 2: one model split over processes"),
    (["--quantize", "int8"], "--tp 2 with --quantize int8: the packed rows"),
])
def test_bench_flags_tensor_parallel_does_not_take_are_one_line(flags, message, llada_dir):
    result = invoke("bench", "-m", llada_dir, "--tp", "2", *flags)
    assert result.exit_code == 2 and message in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1


def test_a_rank_holds_its_heads_its_mlp_rows_and_its_experts_only(moe_dir):
    from fastdllm.models.tensor_parallel import Elsewhere, SplitHead

    lm = tensor_parallel.load(moe_dir, Ranks(1, 2), dtype="fp64")      # loading needs no collective
    dense, sparse = lm.model.blocks
    experts = sparse.mlp.experts
    assert [isinstance(e, Elsewhere) for e in experts] == [True] * 4 + [False] * 4
    assert (dense.n_heads, dense.n_kv_heads, lm.model.n_kv_heads) == (2, 1, 1)
    assert dense.self_attn.q_proj.weight.shape == (2 * 16 + 2 * 1 * 16, 64)      # fused q, k, v of 2 + 1 + 1 heads
    assert dense.mlp.down_proj.weight.shape == (64, 48) and sparse.shared_expert.down_proj.weight.shape == (64, 24)
    head = lm.model.output_head
    assert isinstance(head, SplitHead) and head.offset == head.vocab // 2 and head.weight.shape[0] == head.vocab // 2


def test_tp_1_is_the_one_process_path(llada_dir):
    args = ("generate", "-m", llada_dir, "--dtype", "fp64", "-n", "32", "--json", "def add(a, b):")
    one, tp1 = (json.loads(invoke(*args, *extra).stdout) for extra in ((), ("--tp", "1")))
    assert (tp1["ids"], tp1["nfe"]) == (one["ids"], one["nfe"]) and "tensor_parallel" not in tp1["model"]
