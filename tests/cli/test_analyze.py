"""`fastdllm analyze`: the numbers are real (drift exactly 0 right after a refresh in float64, the
baseline agrees with itself), the JSON is consistent with the run, the HTML is written, and the
measures that do not apply to a family are one-line refusals."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from fastdllm.bench.analyze import analyze, baseline_config, drift_refusal, refusal
from fastdllm.bench.analyze_report import advice
from fastdllm.checkpoints import loading
from fastdllm.cli.app import app
from fastdllm.decode.config import DecodeConfig
from fastdllm.models.attention import BIDIRECTIONAL
from one_line import one_line_refusal

pytestmark = pytest.mark.usefixtures("one_thread")
CFG = DecodeConfig(gen_len=32, block_len=16, cache="dual", rule="threshold", threshold=0.7)
SWEEP = (("threshold", 0.5),)


@pytest.fixture(scope="module")
def llada_run(llada64):
    return analyze(llada64.decoder, llada64.encode("hello", chat=False), CFG, sweep=SWEEP)


def test_drift_is_zero_right_after_a_refresh_and_real_between(llada_run):
    for mode in ("prefix", "dual"):
        steps = llada_run["drift"][mode]["steps"]
        refreshes = [s for s in steps if s["refresh"]]
        assert len(refreshes) == 2                               # one per block
        for s in refreshes:                                      # the cache is the fresh forward
            assert max(s["k_err"] + s["v_err"]) == 0.0
            assert min(s["k_cos"] + s["v_cos"]) == pytest.approx(1.0, abs=1e-12)
        cached = [s for s in steps if not s["refresh"]]
        assert cached and max(max(s["k_err"]) for s in cached) > 1e-6   # stale context shows
        assert all(sum(s["error_share"].values()) == pytest.approx(1.0, abs=1e-3) for s in cached)
    prefix, dual = (llada_run["drift"][m]["mean_error_by_layer"] for m in ("prefix", "dual"))
    assert sum(dual) >= sum(prefix)                              # dual reuses more: drifts more


def test_json_is_consistent_with_the_run(llada_run):
    data = llada_run
    assert data["nfe"] == len(data["steps"]) == sum(b["nfe"] for b in data["blocks"])
    commits = [c for s in data["steps"] for c in s["commits"]]
    assert data["committed"] == len(commits) == sum(b["committed"] for b in data["blocks"])
    assert data["committed_per_forward"] == pytest.approx(data["committed"] / data["nfe"], abs=1e-4)
    assert data["tokens_per_forward"] == pytest.approx(data["generated_tokens"] / data["nfe"], abs=1e-4)
    assert data["agreement"]["agreed"] == sum(bool(c["agrees"]) for c in commits)
    assert data["baseline"]["nfe"] == CFG.gen_len                 # one token per step
    assert [s["nfe"] for s in data["steps"]] == list(range(1, data["nfe"] + 1))
    assert {"rule", "value", "nfe", "agreed", "compared", "agreement"} <= set(data["sweep"][0])
    json.dumps(data)                                             # plain data
    lines = advice(data)
    assert any("dual cache" in line for line in lines) and any("agreed with" in line for line in lines)


def test_the_baseline_agrees_with_itself(llada64):
    data = analyze(llada64.decoder, llada64.encode("hello", chat=False), baseline_config(CFG), sweep=(),
                   drift_modes=())
    assert data["agreement"]["rate"] == 1.0 and data["agreement"]["compared"] == data["committed"]
    assert data["nfe"] == data["baseline"]["nfe"]


def test_a_shifted_family_runs(dream64):
    data = analyze(dream64.decoder, dream64.encode("hello", chat=False), CFG, sweep=(), drift_modes=("dual",))
    assert data["drift"]["dual"]["layers"] == len(dream64.model.blocks)
    assert all(max(s["k_err"]) == 0.0 for s in data["drift"]["dual"]["steps"] if s["refresh"])


def test_block_causal_drift_is_a_one_line_refusal(tiny):
    lm = loading.load(tiny("sdar"), dtype="fp64")
    cfg = DecodeConfig(gen_len=16, block_len=4, cache="dual", rule="threshold", threshold=0.7)
    data = analyze(lm.decoder, lm.encode("hello", chat=False), cfg, sweep=())
    for mode in ("prefix", "dual"):
        why = data["drift"][mode]["refused"]
        assert "block-causally" in why and "\n" not in why
    assert data["nfe"] >= 1 and data["agreement"]["compared"] > 0


def test_refusals_are_one_line():
    renoising = SimpleNamespace(model=SimpleNamespace(sampler="renoise"), name="tiny-gemma")
    assert "resamples whole canvases" in refusal(renoising, CFG)
    one_line_refusal(lambda: analyze(renoising, [1], CFG), "resamples whole canvases")
    masked = SimpleNamespace(model=SimpleNamespace(attention=BIDIRECTIONAL), name="x")
    assert "nothing is cached" in drift_refusal(masked, "none")
    sampled = DecodeConfig(temperature=0.5)
    assert "greedy" in refusal(SimpleNamespace(model=SimpleNamespace(sampler="mask")), sampled)


def test_cli_writes_html_pngs_json_and_advice(llada_dir, tmp_path):
    out = tmp_path / "report" / "a.html"
    args = ["analyze", "-m", str(llada_dir), "-n", "32", "--block-len", "16", "--dtype", "fp64", "hello"]
    r = CliRunner().invoke(app, [*args, "-O", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    assert "agreed with the uncached one-token baseline" in r.stdout
    page = out.read_text()
    assert page.startswith("<!doctype html>") and page.count("data:image/png;base64,") == 5
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(
        ["a.html", "a.json", "a-timeline.png", "a-confidence.png", "a-drift-prefix.png", "a-drift-dual.png",
         "a-sweep.png"])
    numbers = json.loads(out.with_suffix(".json").read_text())
    r = CliRunner().invoke(app, [*args, "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    printed = json.loads(r.stdout)                               # exactly one object
    assert printed["nfe"] == numbers["nfe"] and printed["advice"] == numbers["advice"]


def test_without_matplotlib_one_line_naming_the_extra(llada_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    r = CliRunner().invoke(app, ["analyze", "-m", str(llada_dir), "-n", "32", "hello"])
    assert r.exit_code == 1 and "fastdllm[plot]" in r.stderr and r.stderr.strip().count("\n") == 0


def test_a_prompt_set_gives_its_first_prompt_and_infill_is_refused():
    from fastdllm.bench.prompts import builtin
    from fastdllm.cli.analyze import set_prompt
    from fastdllm.errors import UsageError

    assert set_prompt("code") == builtin("code").prompts[0]
    one_line_refusal(lambda: set_prompt("infill"), "fills holes", UsageError)
