"""`fastdllm eval` and the lm-eval model: answers equal `fastdllm generate`, speed counts answer
tokens only, the Monte Carlo likelihood equals an independent computation, and the CLI's errors.
The tiny local tasks are in tests/eval_task (data paths relative to the repository's root)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from cli_runner import invoke  # noqa: E402
from helpers import TASKS, one_error  # noqa: E402

from fastdllm.decode.config import DecodeConfig  # noqa: E402
from fastdllm.decode.engine import run  # noqa: E402
from fastdllm.errors import UserError  # noqa: E402
from fastdllm.eval.harness import FastdllmLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ROWS = [json.loads(line) for line in (TASKS / "tiny.jsonl").read_text().splitlines()]
CFG = DecodeConfig(gen_len=32, block_len=8, cache="dual", threshold=0.7)


pytestmark = pytest.mark.sweep   # each test's first case in the fast lane, the rest in the full suite (tests/conftest.py)


@pytest.fixture(autouse=True)
def at_root(monkeypatch, one_thread):
    monkeypatch.chdir(ROOT)                  # the tasks' data_files are relative to the root


def request(kind: str, args: tuple, i: int = 0) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=i)


def test_answers_equal_generate_and_speed_counts_answer_tokens_only(llada64):
    harness = FastdllmLM(lm=llada64, cfg=CFG, batch_size=3)
    until = {"until": ["\n"], "max_gen_toks": 12, "do_sample": False}
    answers = harness.generate_until([request("generate_until", (r["context"], until), i) for i, r in enumerate(ROWS)])
    expected_tokens = 0
    for row, answer in zip(ROWS, answers):
        ids = harness.encode(row["context"])
        assert ids == llada64.tokenizer(row["context"])["input_ids"]          # as the tokenizer gives it
        bos = llada64.tokenizer.bos_token if ids[0] == llada64.tokenizer.bos_token_id else ""
        assert ids == llada64.encode(bos + row["context"], chat=False)
        alone = run(llada64.decoder, [ids], DecodeConfig.from_dict({**CFG.to_dict(), "gen_len": 16}))
        r = invoke("generate", "-m", llada64.path, "--dtype", "fp64", "--raw", "-n", "16", "--block-len", "8",
                   "--threshold", "0.7", "--json", bos + row["context"])
        assert json.loads(r.stdout)["ids"] == alone.ids[0]                 # the CLI's answer, alone
        text = llada64.detokenize(alone.ids[0][:12])
        assert answer == text.split("\n")[0]                               # cut at 12 tokens, then at "\n"
        expected_tokens += len(alone.ids[0][:12])
    s = harness.stats
    assert s.answers == 4 and s.answer_tokens == expected_tokens
    assert s.answer_tokens <= 4 * 12                                       # never a prompt token
    assert s.row_forwards >= s.forwards and s.committed <= 4 * 16


def naive_likelihood(lm, context: list[int], target: list[int], mc_num: int, mc_batch: int, seed: int) -> float:
    """eval_llada.py's estimate written out with loops, the draws in the documented order."""
    g = torch.Generator().manual_seed(seed)
    L, b = len(target), mc_batch
    values = []
    for _ in range(mc_num // b):
        k = int(torch.randint(1, L + 1, (), generator=g))
        total = 0.0
        for i in range(b):
            n = (round(k + i * L / b) - 1) % L + 1
            order = torch.randperm(L, generator=g).tolist()
            masked = set(order[:n])
            ids = context + [lm.specials.mask if j in masked else t for j, t in enumerate(target)]
            with torch.no_grad():
                logp = torch.log_softmax(lm.model(torch.tensor([ids])).logits[0].double(), -1)
            total += sum(-float(logp[len(context) + j, target[j]]) for j in masked) / (n / L)
        values.append(total / b)
    return -sum(values) / len(values)


def test_loglikelihood_equals_an_independent_computation(llada64):
    harness = FastdllmLM(lm=llada64, cfg=CFG, mc_num=6, mc_batch=3)
    row = ROWS[0]
    (ll, greedy), = harness.loglikelihood([request("loglikelihood", (row["context"], row["target"]))])
    context, target = harness._pair(row["context"], row["target"])
    assert context == harness.encode(row["context"].rstrip()) and len(target) > 3   # the "\n" moved over
    assert ll == pytest.approx(naive_likelihood(llada64, context, target, 6, 3, CFG.seed), abs=1e-9)
    assert ll < 0
    ids = context + [llada64.specials.mask] * len(target)              # LLaDA's greedy check, written out
    while llada64.specials.mask in ids:
        at = [i for i, t in enumerate(ids) if t == llada64.specials.mask]
        with torch.no_grad():
            probs = torch.softmax(llada64.model(torch.tensor([ids])).logits[0, at].double(), -1)
        best = int(probs.max(-1).values.argmax())
        ids[at[best]] = int(probs[best].argmax())
    assert greedy == (ids[len(context):] == target)


def test_trailing_spaces_of_the_context_go_to_the_continuation(llada64):
    harness = FastdllmLM(lm=llada64, cfg=CFG)
    context, target = harness._pair("x = ", "1")
    assert context == harness.encode("x =") and context + target == harness.encode("x = 1")


def test_block_causal_families_refuse_likelihoods(tiny):
    from fastdllm.checkpoints import loading

    lm = loading.load(tiny("sdar"), dtype="fp32")
    harness = FastdllmLM(lm=lm, cfg=DecodeConfig(gen_len=8, block_len=4))
    with pytest.raises(UserError, match="causal between blocks"):
        harness.loglikelihood([request("loglikelihood", ("a", " b"))])


@pytest.mark.slow
def test_eval_runs_tasks_and_profiles_side_by_side(llada_dir, tmp_path):
    out = tmp_path / "r.json"
    r = invoke("eval", "-m", llada_dir, "--dtype", "fp64", "--include-path", TASKS, "--tasks",
               "tiny_next_line,tiny_choice", "--profiles", "baseline,default", "--mc-num", "2", "--mc-batch", "2",
               "--no-check-greedy", "--output", out)
    assert r.exit_code == 0, r.stderr
    records = json.loads(out.read_text())
    assert [(x["task"], x["profile"]) for x in records] == [
        ("tiny_next_line", "baseline"), ("tiny_next_line", "default"), ("tiny_choice", "baseline"),
        ("tiny_choice", "default")]
    gen, _, choice, _ = records
    assert gen["metric"] == "exact_match,none" and choice["metric"] == "acc,none"
    assert gen["samples"] == 4 and gen["answers"] == 4 and choice["answers"] == 12      # 4 docs x 3 choices
    assert gen["nfe_per_answer"] == 32.0 and gen["committed_per_forward"] == 1.0   # one block of 32, 1 per step
    assert gen["tokens_per_forward"] == round(gen["answer_tokens"] / (32 * gen["answers"]), 3) < 1   # answers: 16 tokens at most
    assert choice["nfe_per_answer"] == 1.0 and choice["tokens_per_second"] is None     # 2 samples, one forward
    assert records[1]["change"]["profile"] == "baseline" and records[1]["config"]["cache"] == "dual"
    for x in records:
        assert 0 <= x["value"] <= 1 and x["stderr"] is not None and x["lm_eval"] and x["machine"]
    assert gen["tokens_per_second"] == pytest.approx(gen["answer_tokens"] / gen["decode_seconds"], rel=0.005)
    table = invoke("eval", "-m", llada_dir, "--include-path", TASKS, "--tasks", "tiny_next_line",
                   "--profiles", "default", "--limit", "2", "--threshold", "0.55", "-o", "md")
    assert table.exit_code == 0 and table.stdout.startswith("| task | profile |")
    assert "| t=0.55 |" in table.stdout                                   # a decoding flag over the profile


@pytest.mark.parametrize("args, code, words", [
    (["--tasks", "no_such_task"], 2, "unknown task no_such_task"),
    (["--tasks", "tiny_unsafe"], 1, "--confirm-run-unsafe-code"),
    (["--tasks", "tiny_next_line", "--mc-num", "5", "--mc-batch", "2"], 2, "multiple of --mc-batch"),
    (["--tasks", "tiny_next_line", "--format", "xml"], 2, "expected one of"),
])
def test_eval_mistakes_are_one_line_errors(llada_dir, args, code, words):
    r = invoke("eval", "-m", llada_dir, "--include-path", TASKS, "--limit", "1", *args)
    assert r.exit_code == code and one_error(r.stderr, words), r.stderr


@pytest.mark.slow
def test_a_hub_task_offline_is_one_line(llada_dir):
    r = invoke("eval", "-m", llada_dir, "--tasks", "gsm8k", "--limit", "1",
               env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert r.exit_code == 1 and one_error(r.stderr, "Hugging Face hub"), r.stderr


@pytest.mark.slow
def test_lm_evals_own_command_line_with_fastdllm_registered(llada_dir, tmp_path):
    """`python -m fastdllm.eval.harness` (lm-eval's CLI) run outside the checkout, so that the installed
    package is the one imported; the task's data path made absolute for that."""
    import subprocess
    import sys

    (tmp_path / "tasks").mkdir()
    yaml = (TASKS / "tiny_next_line.yaml").read_text().replace("tests/eval_task/tiny.jsonl", str(TASKS / "tiny.jsonl"))
    (tmp_path / "tasks" / "tiny_next_line.yaml").write_text(yaml)

    def lm_eval(model_args: str):
        return subprocess.run([sys.executable, "-m", "fastdllm.eval.harness", "--model", "fastdllm", "--model_args",
                               f"pretrained={llada_dir},dtype=fp32,{model_args}", "--tasks", "tiny_next_line",
                               "--include_path", str(tmp_path / "tasks"), "--limit", "2"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=600)

    ok = lm_eval("profile=fast")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "tiny_next_line" in ok.stdout and "exact_match" in ok.stdout and "fastdllm (" in ok.stdout
    bad = lm_eval("treshold=0.5")
    assert bad.returncode == 2 and one_error(bad.stderr, "did you mean 'threshold'"), bad.stderr[-2000:]


def test_dream_prompts_get_the_bos_its_authors_evaluate_with(dream64, llada64):
    """Dream's tokenizer adds no BOS, but its authors' eval scripts (Fast-dLLM's and Dream's own,
    add_bos_token=true) put <|beginoftext|> before every plain prompt, and none before a chat-templated
    one; LLaDA's contexts stay as its tokenizer gives them."""
    tok = dream64.tokenizer
    assert tok("x")["input_ids"][:1] != [tok.bos_token_id]          # the tokenizer alone adds none
    harness = FastdllmLM(lm=dream64, cfg=CFG)
    assert harness.encode("x = 1") == [tok.bos_token_id] + tok("x = 1")["input_ids"]
    templated = harness.apply_chat_template([{"role": "user", "content": "x = 1"}])
    assert harness.encode(templated) == tok(templated, add_special_tokens=False)["input_ids"]
    assert harness.encode(templated)[0] != tok.bos_token_id
    plain = FastdllmLM(lm=llada64, cfg=CFG)
    assert plain.encode("x = 1") == llada64.tokenizer("x = 1")["input_ids"]
