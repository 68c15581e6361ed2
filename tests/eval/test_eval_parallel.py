"""Data-parallel eval and bench on CPU (gloo), through the real launchers: 2 processes give the
single process's numbers (every answer, every log-likelihood, metrics, standard errors, counts),
with lm-eval's padding exercised (3 documents over 2 ranks), seeded sampling included; a rank that
fails ends the run with one error line naming it and the finished pairs kept in the file.

Every run is a fresh process (torch, lm-eval): the runs are few and on the tiny local tasks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tests" / "eval_task"
EVAL = ["eval", "--dtype", "fp64", "--include-path", str(TASKS), "--tasks", "tiny_next_line,tiny_choice",
        "--profiles", "default", "--limit", "3", "--mc-num", "4", "--mc-batch", "2"]
# counts and figures that do not depend on how the work was split (the timings do)
SAME = ["task", "profile", "metric", "value", "stderr", "metrics", "samples", "answers", "answer_tokens",
        "nfe_per_answer", "tokens_per_forward", "config"]


pytestmark = pytest.mark.slow   # processes and servers: the full suite only (tests/conftest.py)


def run(args: list[str], env: dict | None = None, timeout: int = 300, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """A command in the repository's root by default, where a user who followed the README stands
    (there `-m fastdllm` imports the checkout's `fastdllm/` folder, fastdllm/source_tree.py maps its
    `cli/` and `profiles/`); no PYTHONSAFEPATH, no PYTHONPATH of the test's."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})})


def fastdllm(*args) -> list[str]:
    return [sys.executable, "-m", "fastdllm", *map(str, args)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def single(llada_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "one.json"
    r = run(fastdllm(*EVAL, "-m", llada_dir, "--output", out))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def test_lm_evals_protocol_gives_every_answer_and_likelihood_of_one_process(llada_dir, tmp_path, restore_threads):
    """lm-eval's own command line under torchrun, sampling with a seed: every answer and every
    log-likelihood it logs is what one process computes for the same request."""
    from lm_eval.api.instance import Instance

    from fastdllm.eval.harness import FastdllmLM

    args = f"pretrained={llada_dir},dtype=fp64,profile=default,mc_num=4,mc_batch=2,seed=3"
    r = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             "-m", "fastdllm.eval.harness", "--model", "fastdllm", "--model_args", args,
             "--tasks", "tiny_next_line,tiny_choice", "--include_path", str(TASKS), "--limit", "3",
             "--gen_kwargs", "do_sample=true,temperature=0.9", "--log_samples", "--output_path", str(tmp_path)])
    assert r.returncode == 0, r.stderr[-3000:]
    found = {p.name.split("_20")[0]: p for p in tmp_path.rglob("*.jsonl")}
    alone = FastdllmLM(**dict(kv.split("=") for kv in args.split(",")))
    # each rank ran on its share of the cores (World.share_threads): float64 sums split over another
    # thread count may differ in the last bit on some CPUs, so the single process uses the same count
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // 2))
    for task, method in (("tiny_next_line", alone.generate_until), ("tiny_choice", alone.loglikelihood)):
        samples = sorted(map(json.loads, found[f"samples_{task}"].read_text().splitlines()), key=lambda x: x["doc_id"])
        assert [x["doc_id"] for x in samples] == [0, 1, 2]               # rank 0 has 0 and 2, rank 1 has 1
        kind = "generate_until" if task == "tiny_next_line" else "loglikelihood"
        for x in samples:
            # each request's first response (lm-eval appends its padding's to the last request's)
            logged = [resp[0] for resp in x["resps"]]
            requests = [Instance(kind, {}, tuple(a.values()), i) for i, a in enumerate(x["arguments"].values())]
            expected = [v if isinstance(v, str) else [str(v[0]), str(v[1])] for v in method(requests)]
            assert logged == expected, (task, x["doc_id"])


def test_sampled_requests_draw_and_each_copy_has_its_own_seed(llada64):
    """What makes the sampled comparison above mean something: sampling changes the answers, and
    a request's k-th copy (lm-eval's repeats) is `generate` alone with seed + k, whatever its batch."""
    from lm_eval.api.instance import Instance

    from fastdllm.decode.config import DecodeConfig
    from fastdllm.decode.engine import run as decode
    from fastdllm.eval.harness import FastdllmLM

    cfg = DecodeConfig(gen_len=16, block_len=8, threshold=0.7, seed=5)
    rows = [json.loads(line)["context"] for line in (TASKS / "tiny.jsonl").read_text().splitlines()]
    harness = FastdllmLM(lm=llada64, cfg=cfg, batch_size=4)

    def ask(sample: bool, repeats: int = 1):
        kwargs = {"until": ["\n"], "max_gen_toks": 16, "do_sample": sample, "temperature": 0.9}
        requests = [Instance("generate_until", {}, (c, kwargs), i, (None, i, repeats)) for i, c in enumerate(rows)]
        return harness.generate_until([r for r in requests for _ in range(repeats)])

    assert ask(True) != ask(False)
    twice = ask(True, repeats=2)
    for k in (0, 1):
        alone = decode(llada64.decoder, [harness.encode(rows[0])], DecodeConfig.from_dict({**cfg.to_dict(), "temperature": 0.9, "seed": 5 + k}))
        assert twice[k] == llada64.detokenize(alone.ids[0]).split("\n")[0]
    assert twice[0] != twice[1]


def test_metrics_come_back_in_the_document_order_of_one_process():
    from fastdllm.eval.distributed import copies, in_document_order

    ranks = [{"t": {("acc", "none"): [0, 2, 4]}}, {"t": {("acc", "none"): [1, 3]}}]
    assert in_document_order(ranks) == [{"t": {("acc", "none"): [0, 1, 2, 3, 4]}}]
    samples = [{"t": [{"doc_id": 0}]}, {"t": [{"doc_id": 1}]}]       # logged samples: as lm-eval keeps them
    assert in_document_order(samples) == samples

    class Request:
        repeats = 2

    a, b = Request(), Request()
    assert copies([a, a, b, b, b, b]) == [0, 1, 0, 1, None, None]    # b's last two: lm-eval's padding


def test_two_processes_give_the_single_process_table(llada_dir, single, tmp_path):
    """accelerate launch (its multi-process launcher; on CPU --multi_gpu, torch elastic underneath):
    the table's numbers are the single process's. (--num-processes: the failure and bench tests.)"""
    out = tmp_path / "two.json"
    args = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(free_port()), "-m", "fastdllm", *map(str, EVAL), "-m", str(llada_dir),
            "--output", str(out)]
    r = run(args)
    assert r.returncode == 0, r.stderr[-3000:]
    two = json.loads(out.read_text())
    assert [{k: x[k] for k in SAME} for x in two] == [{k: x[k] for k in SAME} for x in single]
    assert r.stderr.count("eval: 2 task(s)") == 1                         # rank 0 alone speaks
    gen = two[0]
    assert gen["processes"] == 2 and [x["rank"] for x in gen["ranks"]] == [0, 1]
    assert [x["answers"] for x in gen["ranks"]] == [2, 1]                # documents 0, 2 and 1; no padding decoded
    assert sum(x["answer_tokens"] for x in gen["ranks"]) == gen["answer_tokens"]
    assert gen["decode_seconds"] == max(x["decode_seconds"] for x in gen["ranks"])
    assert gen["tokens_per_second"] == pytest.approx(gen["answer_tokens"] / gen["decode_seconds"], rel=0.005)
    assert single[0]["processes"] == 1 and single[0]["ranks"] is None


def test_a_failing_rank_is_one_line_and_the_finished_tasks_are_kept(llada_dir, tmp_path):
    out = tmp_path / "r.json"
    r = run(fastdllm(*EVAL, "-m", llada_dir, "--output", out, "--num-processes", "2"),
            env={"FASTDLLM_FAIL_RANK": "1:tiny_choice"})
    assert r.returncode == 1
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["error: rank 1: RuntimeError: failure injected by FASTDLLM_FAIL_RANK"], r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert [x["task"] for x in json.loads(out.read_text())] == ["tiny_next_line"]


def test_bench_two_processes_merge_into_the_single_process_table(llada_dir, tmp_path):
    bench = ["bench", "-m", llada_dir, "--dtype", "fp64", "--configs", "baseline,parallel", "-n", "16",
             "--block-len", "8", "--n-prompts", "3", "--prompt-set", "code", "--warmup", "0", "-r", "1"]
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    r1 = run(fastdllm(*bench, "--output", one))
    r2 = run(fastdllm(*bench, "--output", two, "--num-processes", "2"))
    assert r1.returncode == 0 and r2.returncode == 0, (r1.stderr + r2.stderr)[-3000:]
    a, b = (json.loads(p.read_text())["records"] for p in (one, two))
    same = ["config", "nfe", "generated_tokens", "tokens_per_forward", "agreement_tokens", "agreement_answers",
            "quality"]
    assert [{k: x[k] for k in same} for x in b] == [{k: x[k] for k in same} for x in a]
    assert b[0]["processes"] == 2 and [x["prompts"] for x in b[0]["ranks"]] == [2, 1]
    assert sum(x["generated_tokens"] for x in b[0]["ranks"]) == b[0]["generated_tokens"]
    # one repetition: its seconds are its slowest rank's (with more, the median of the slowest ranks'
    # seconds is not the slowest rank's median, and the two need not agree)
    assert b[0]["seconds"] == max(x["seconds"] for x in b[0]["ranks"])


BENCH = ["bench", "--dtype", "fp64", "--configs", "baseline", "-n", "8", "--block-len", "8", "--n-prompts", "2",
         "--prompt-set", "code", "--warmup", "0", "-r", "1"]
LAUNCHERS = {
    "num-processes": lambda out: fastdllm(*BENCH, "--output", out, "--num-processes", "2"),
    "torchrun": lambda out: [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "fastdllm", *BENCH, "--output", str(out)],
    "accelerate": lambda out: [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                               "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                               "--main_process_port", str(free_port()), "-m", "fastdllm", *BENCH, "--output", str(out)],
}


@pytest.mark.parametrize("where", ["root", "elsewhere"])
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_launcher_runs_from_the_checkout_root_and_from_elsewhere(launcher, where, llada_dir, tmp_path):
    """`-m fastdllm` under torchrun and accelerate, and --num-processes (whose processes run the
    parent's own package): in the repository root, where `python -m` finds the checkout's
    `fastdllm/` folder first, and in any other directory. No traceback, two ranks, one table."""
    out = tmp_path / "two.json"
    r = run(LAUNCHERS[launcher](out) + ["-m", str(llada_dir)], cwd=ROOT if where == "root" else tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    records = json.loads(out.read_text())["records"]
    assert records[0]["processes"] == 2 and [x["prompts"] for x in records[0]["ranks"]] == [1, 1]
