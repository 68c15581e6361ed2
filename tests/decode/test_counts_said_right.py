"""Counts as a newcomer reads them: bench's progress in a pipe numbers every run, none skipped;
"1 token", never "1 tokens"; chat's turn counts the conversation (1 again after /clear); the
README's `info` sample shows every row the command prints."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from fastdllm.cli.app import app
from fastdllm.decode import profiles
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.events import Result
from fastdllm.terminal import chat as repl
from fastdllm.terminal.stats import stats_line
from fastdllm.units import plural

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_bench_progress_in_a_pipe_numbers_every_run(llada_dir):
    r = invoke("bench", "-m", llada_dir, "-n", "16", "--block-len", "16", "-c", "baseline,dual", "--n-prompts", "2",
               "--warmup", "1", "-r", "2", "--format", "jsonl")
    assert r.exit_code == 0, r.stderr
    assert "bench: 2 rows x 2 chat prompts (10 runs)" in r.stderr
    ranges = [(int(a), int(b or a), int(n)) for a, b, n in re.findall(r"^\[(\d+)(?:-(\d+))?/(\d+)\] ", r.stderr, re.M)]
    assert [(a, b) for a, b, _ in ranges] == [(1, 1), (2, 2), (3, 4), (5, 6), (7, 8), (9, 10)]   # none skipped
    assert {n for _, _, n in ranges} == {10}
    assert "baseline 1/step · gen 16 · block 16 · batch 1 · rep 2/2" in r.stderr    # what each line starts


def test_one_of_a_thing_is_singular():
    assert (plural(1, "token"), plural(2, "token"), plural(0, "token")) == ("1 token", "2 tokens", "0 tokens")
    assert plural(1, "code prompt") == "1 code prompt" and plural(3, "entry", "entries") == "3 entries"
    one = Result(ids=[[7]], texts=["x"], canvas=None, prompt_tokens=[3], nfe=1, committed=1, edits=0, blocks_decoded=1,
                 early_stopped=True, seconds_first_step=0.01, seconds_total=0.01, peak_memory_bytes=1,
                 peak_memory_kind="process RSS", cache_bytes=0, config=DecodeConfig(gen_len=32))
    assert stats_line(one).startswith("1 token · 1 forward · 1.00 tok/forward")
    totals = repl.Totals(answers=1, tokens=1, nfe=1, seconds=1.0)
    assert totals.describe().startswith("1 answer · 1 token · 1 forward · ")


def test_chat_turns_count_the_conversation_not_the_session():
    s = repl.Session(DecodeConfig(), profiles.find("default"))
    assert repl.turn_number(s.messages) == 1
    result = Result(ids=[[7, 8]], texts=["x"], canvas=None, prompt_tokens=[3], nfe=2, committed=2, edits=0,
                    blocks_decoded=1, early_stopped=True, seconds_first_step=0.01, seconds_total=0.1,
                    peak_memory_bytes=1, peak_memory_kind="process RSS", cache_bytes=0, config=DecodeConfig())
    s.record([], "hi", "hello", result)
    s.record(s.messages, "more", "sure", result)
    assert repl.turn_number(s.messages) == 3
    history, _ = repl.regen_target(s.messages)
    assert repl.turn_number(history) == 2                          # /regen answers turn 2 again
    repl.run_command(s, "/clear")
    assert repl.turn_number(s.messages) == 1 and s.totals.answers == 2   # the session's totals stay


def labels(lines: list[str]) -> list[str]:
    return [re.split(r" {2,}", line.strip())[0] for line in lines if line.strip()]


def test_the_readme_info_sample_shows_every_row_info_prints():
    readme = (ROOT / "README.md").read_text()
    sample = re.search(r"```console\n\$ fastdllm info\n(.*?)```", readme, re.S).group(1)
    r = invoke("info")
    assert r.exit_code == 0, r.stderr
    assert labels(sample.splitlines()) == labels(r.stdout.splitlines())
