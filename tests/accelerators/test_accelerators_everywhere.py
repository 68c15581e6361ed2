"""Every accelerator (docs/accelerators.md) outside `generate`: a `serve` request naming the method's
profile in its `fastdllm` object answers what `generate -P PROFILE` answers (the same ids, NFE);
`chat -P PROFILE` answers; `eval --profiles` scores every method beside the baseline. The methods'
own exactness tests are tests/accelerators/test_dus.py, test_credit.py, test_prophet.py, test_dpad.py and
test_dkv.py, test_klass.py, test_local_leap.py and test_dllm_cache.py."""

from __future__ import annotations


import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from serve_process import ServerProcess  # noqa: E402
from cli_runner import invoke  # noqa: E402
from helpers import TASKS  # noqa: E402
from fastdllm.checkpoints.builtin import NAME as BUILTIN  # noqa: E402

PROMPT = "def add(a, b):"
METHODS = ["dus", "dual-dus", "credit", "prophet", "dual-prophet", "dpad", "dkv", "klass", "local-leap", "dllm-cache"]
# Prophet's profiles write their anchor ("The answer is") at offsets 200-202 of a 256 canvas; the
# request and the command move it to 40-42 of 64 (256 one-token steps cost a minute twice here)
ANCHOR = "40:The|41:answer|42:is"


pytestmark = pytest.mark.slow   # processes and servers: the full suite only (tests/conftest.py)


@pytest.fixture(scope="module")
def server():
    """The built-in tiny code model in float64, the server's defaults."""
    process = ServerProcess("--dtype", "fp64")
    yield process
    assert process.stop() == 0, process.log


@pytest.mark.parametrize("profile", METHODS)
def test_a_request_decodes_as_generate_with_the_profile(server, profile):
    anchor = {"answer_anchor": ANCHOR} if "prophet" in profile else {}
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=300)
    answer = client.completions.create(model=BUILTIN, prompt=PROMPT, max_tokens=64,
                                       extra_body={"fastdllm": {"profile": profile, **anchor}})
    flags = ["--answer-anchor", ANCHOR] if anchor else []
    r = invoke("generate", "--dtype", "fp64", "--raw", "-P", profile, "-n", 64, *flags, "--json", PROMPT)
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    extra = answer.model_extra["fastdllm"]
    assert extra["profile"] == profile and extra["completion_ids"] == record["ids"]
    assert answer.usage.nfe == record["nfe"] and answer.choices[0].text == record["text"]


def test_chat_answers_as_generate_with_each_method(llada_dir):
    for profile in ("dus", "credit", "dpad", "dkv", "klass", "local-leap", "dllm-cache"):
        r = invoke("chat", "-m", llada_dir, "--dtype", "fp64", "-P", profile, "-n", "64", input="Hello there\n/bye\n")
        assert r.exit_code == 0, (profile, r.stderr)
        g = invoke("generate", "-m", llada_dir, "--dtype", "fp64", "-P", profile, "-n", "64", "--json", "Hello there")
        assert g.exit_code == 0, (profile, g.stderr)
        assert r.stdout == json.loads(g.stdout)["text"] + "\n", profile           # stdout holds the answer only


def test_eval_scores_each_method_beside_the_baseline(llada_dir, tmp_path):
    out = tmp_path / "r.json"
    profiles = ["baseline", "dus", "credit", "dpad", "dkv", "klass", "local-leap", "dllm-cache"]
    r = invoke("eval", "-m", llada_dir, "--dtype", "fp64", "--include-path", TASKS, "--tasks", "tiny_next_line",
               "--profiles", ",".join(profiles), "--limit", "2", "--output", out)
    assert r.exit_code == 0, r.stderr
    records = json.loads(out.read_text())
    assert [x["profile"] for x in records] == profiles
    for x in records:
        assert 0 <= x["value"] <= 1 and x["answers"] == 2 and x["nfe_per_answer"] > 0
    dus = records[1]
    assert dus["config"]["rule"] == "dilated" and dus["nfe_per_answer"] < records[0]["nfe_per_answer"]
