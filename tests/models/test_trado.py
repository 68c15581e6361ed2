"""TraDo (RL-tuned SDAR checkpoints, the `sdar` format): its authors' sampling settings as the
`trado` profile, seeded runs reproducible, and the Thinking model's opened-thought prompt."""

from __future__ import annotations

import json

import pytest

from fastdllm.testing.tiny_blockdiff import write_sdar
from fastdllm.decode import profiles

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_profile_is_the_authors_setting():
    cfg = profiles.resolve(profiles.find("trado"), {})
    assert (cfg.block_len, cfg.steps_per_block, cfg.rule, cfg.threshold, cfg.temperature, cfg.cache) == \
        (4, 4, "dynamic", 0.9, 1.0, "prefix")


def test_sampled_runs_follow_their_seed(tmp_path):
    from cli_runner import invoke

    path = write_sdar(tmp_path / "trado-like")

    def ids(seed: int, *extra) -> list[int]:
        r = invoke("generate", "-m", path, "-P", "trado", "-n", "16", "--no-early-stop", "--seed", seed, "--json",
                *extra, "hi")
        assert r.exit_code == 0, r.stderr
        return json.loads(r.stdout)

    first, again, other = ids(1), ids(1), ids(2)
    assert first["ids"] == again["ids"] and first["ids"] != other["ids"]   # sampling, at temperature 1
    assert first["config"]["temperature"] == 1.0 and first["profile"] == "trado"
    thinking = ids(1, "--think")
    assert thinking["prompt_tokens"] == first["prompt_tokens"] + 2          # `<think>` and a newline
