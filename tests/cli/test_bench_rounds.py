"""bench's repetitions (fastdllm/bench/rounds.py): interleaved across rows, median and spread, the
unreliable mark, and `-r auto`'s extra rounds for unreliable rows only, on scripted timings."""

from __future__ import annotations

import pytest

from fastdllm.bench import format as bench_format
from fastdllm.bench import prompts
from fastdllm.bench import runner as bench
from fastdllm.bench.cases import Sweep, expand, pick_rows
from fastdllm.bench.runner import compare

NO_ENV: dict = {}                     # isolate expansion from FASTDLLM_* variables of the shell


def scripted_measure(lm, names, seconds, monkeypatch, repetitions=3):
    """bench.measure on one prompt, each timed run's seconds (in the order run) taken from
    `seconds` and 10 tokens counted per answer; returns (records, the runs seen, when rows came)."""
    real, clock = bench._timed_run, iter(seconds)

    def scripted(*args):
        result = real(*args)
        result.seconds_total, result.ids = next(clock), [[7] * 10]
        return result

    monkeypatch.setattr(bench, "_timed_run", scripted)
    cases = expand(pick_rows(names), Sweep(gen_len=(16,), block_len=(8,)), environ=NO_ENV)
    seen, arrived, measured = [], [], []
    for m in bench.measure(lm, cases, prompts.PromptSet("t", ["def f(x):\n"]), chat=False, warmup=1,
                           repetitions=repetitions, on_run=lambda case, what: seen.append((case.name, what))):
        arrived.append((m.record["config"], len(seen)))
        measured.append(m)
    return compare(measured), seen, arrived


def test_repetitions_interleave_and_give_median_and_spread(llada64, one_thread, monkeypatch):
    records, seen, arrived = scripted_measure(llada64, ["baseline", "dual"], [2.0, 1.0, 4.0, 0.4, 2.5, 0.6],
                                              monkeypatch)
    assert seen == [("baseline", "warm-up"), ("dual", "warm-up"),          # warm-ups, then round-robin
                    *[(name, f"rep {r}/3") for r in (1, 2, 3) for name in ("baseline", "dual")]]
    assert arrived == [("baseline", 7), ("dual", 8)]                      # each row after its last repetition
    base, dual = records
    assert base["tokens_per_second_reps"] == [5.0, 2.5, 4.0] and base["tokens_per_second"] == 4.0
    # the spread of the repetitions the median keeps (2.5 is outvoted), and that of all three
    assert base["tokens_per_second_spread"] == pytest.approx((5.0 - 4.0) / 4.5, abs=1e-4)
    assert base["tokens_per_second_spread_all"] == pytest.approx((5.0 - 2.5) / 4.0)
    assert dual["tokens_per_second_reps"] == [10.0, 25.0, 16.667] and dual["tokens_per_second"] == 16.667
    assert dual["tokens_per_second_spread"] == pytest.approx(6.667 / 13.333, abs=1e-4) and dual["seconds"] == 0.6
    assert dual["tokens_per_second_spread_all"] == pytest.approx(15.0 / 16.667, abs=1e-4)
    assert dual["speedup"] == pytest.approx(16.667 / 4.0, abs=1e-3)
    assert (dual["speedup_min"], dual["speedup_max"]) == (2.0, 10.0)
    # of 3, the repetition farthest from the median (25) is outvoted: 10 and 16.7 still spread 40%
    assert dual["speedup_reliable"] is False and base["speedup_reliable"] is None and base["speedup"] == 1.0
    md = bench_format.render(records, "md")
    assert "| ~4.17x |" in md and "| 50.0% |" in md and "~: speed-up unreliable" in md
    assert "3 timed repetitions interleaved, tok/s their median, spread (fastest - slowest) / median of the " \
           "repetitions it keeps (of 3 or more, the one farthest from it left out)" in md


def test_steady_repetitions_leave_the_speedup_unmarked(llada64, one_thread, monkeypatch):
    records, _, _ = scripted_measure(llada64, ["baseline", "dual"], [2.0, 1.0, 2.1, 1.02, 2.05, 0.98], monkeypatch)
    assert records[1]["speedup_reliable"] is True and records[1]["tokens_per_second_spread"] < 0.05
    md = bench_format.render(records, "md")
    assert "~" not in md and f"| {records[1]['speedup']:.2f}x |" in md


def test_auto_repetitions_take_two_rounds_on_a_steady_machine(llada64, one_thread, monkeypatch):
    records, seen, arrived = scripted_measure(llada64, ["baseline", "prefix", "dual"],
                                              [2.0, 1.0, 0.5, 2.05, 1.02, 0.51], monkeypatch, repetitions="auto")
    assert seen[3:] == [(name, f"rep {r}") for r in (1, 2) for name in ("baseline", "prefix", "dual")]
    assert arrived == [("baseline", 9), ("prefix", 9), ("dual", 9)]     # after the last round
    assert [r["repetitions"] for r in records] == [2, 2, 2] and records[0]["repetitions_asked"] == "auto"
    assert records[1]["speedup_reliable"] is True and records[2]["speedup_reliable"] is True
    assert "2 timed repetitions (auto) interleaved" in bench_format.render(records, "md")


def test_auto_repetitions_rerun_a_noisy_row_alone(llada64, one_thread, monkeypatch):
    # round 2: a burst slows dual to half; round 3 reruns dual alone (its baseline was steady),
    # prefix is left alone
    seconds = [2.0, 1.0, 0.5, 2.0, 1.0, 1.0, 0.5, 9.0]
    records, seen, _ = scripted_measure(llada64, ["baseline", "prefix", "dual"], seconds, monkeypatch,
                                        repetitions="auto")
    assert seen[3:] == [*[(n, f"rep {r}") for r in (1, 2) for n in ("baseline", "prefix", "dual")], ("dual", "rep 3")]
    base, prefix, dual = records
    assert (base["repetitions"], prefix["repetitions"], dual["repetitions"]) == (2, 2, 3)
    assert dual["tokens_per_second_reps"] == [20.0, 10.0, 20.0] and dual["tokens_per_second"] == 20.0
    assert dual["speedup_reliable"] is True and dual["speedup"] == pytest.approx(4.0)   # the burst outvoted
    assert "2-3 timed repetitions (auto)" in bench_format.render(records, "md")
    assert len(seen) == 3 + 7                                               # the last scripted time unused


def test_auto_repetitions_rerun_a_row_until_its_spread_is_steady(llada64, one_thread, monkeypatch):
    # dual 20 then 17.5 tok/s: 13%, under the unreliable mark (25%) but above STEADY (10%); a third
    # round of dual alone, and the shown spread is that of the two the median keeps
    from fastdllm.bench.rounds import STEADY

    seconds = [2.0, 0.5, 2.02, 0.57, 0.51, 9.0]
    records, seen, _ = scripted_measure(llada64, ["baseline", "dual"], seconds, monkeypatch, repetitions="auto")
    assert seen[2:] == [("baseline", "rep 1"), ("dual", "rep 1"), ("baseline", "rep 2"), ("dual", "rep 2"),
                        ("dual", "rep 3")]
    base, dual = records
    assert dual["tokens_per_second_reps"] == [20.0, 17.544, 19.608] and base["repetitions"] == 2
    assert dual["tokens_per_second_spread"] == pytest.approx(0.392 / 19.804, abs=1e-4)
    assert dual["tokens_per_second_spread_all"] == pytest.approx(2.456 / 19.608, abs=1e-4)
    assert dual["tokens_per_second_spread"] < STEADY < dual["tokens_per_second_spread_all"]
    assert "| 2.0% |" in bench_format.render(records, "md")


def test_auto_repetitions_rerun_a_noisy_baseline_alone(llada64, one_thread, monkeypatch):
    seconds = [2.0, 0.5, 4.0, 0.5, 2.0, 9.0]                               # the baseline: 5, 2.5, then 5 tok/s
    records, seen, _ = scripted_measure(llada64, ["baseline", "dual"], seconds, monkeypatch, repetitions="auto")
    assert seen[2:] == [("baseline", "rep 1"), ("dual", "rep 1"), ("baseline", "rep 2"), ("dual", "rep 2"),
                        ("baseline", "rep 3")]
    assert records[0]["tokens_per_second_reps"] == [5.0, 2.5, 5.0] and records[1]["speedup_reliable"] is True


def test_auto_repetitions_rerun_a_baseline_above_the_steady_spread_alone(llada64, one_thread, monkeypatch):
    seconds = [2.0, 0.5, 2.25, 0.5, 2.0, 9.0]                              # 5 and 4.4 tok/s: 12%, again alone
    records, seen, _ = scripted_measure(llada64, ["baseline", "dual"], seconds, monkeypatch, repetitions="auto")
    assert seen[-1] == ("baseline", "rep 3") and len(seen) == 2 + 5 and records[0]["tokens_per_second_spread"] == 0.0


def test_auto_repetitions_rerun_overlapping_ranges_with_their_baseline(llada64, one_thread, monkeypatch):
    # ranges overlap, medians 14% apart (baseline 5.0 and 4.2 tok/s, dual 5.6 and 4.9): both again
    seconds = [2.0, 10 / 5.6, 10 / 4.2, 10 / 4.9, 10 / 4.6, 10 / 5.5, 9.0]
    records, seen, _ = scripted_measure(llada64, ["baseline", "dual"], seconds, monkeypatch, repetitions="auto")
    assert seen[-2:] == [("baseline", "rep 3"), ("dual", "rep 3")] and len(seen) == 2 + 6
    assert records[1]["speedup_reliable"] is True                   # of three, 5.5 and 5.6 against 4.2 and 4.6


def test_auto_repetitions_read_overlapping_ranges_of_the_same_speed_as_about_1x(llada64, one_thread, monkeypatch):
    # equal medians (4.8 tok/s), spreads 8% and 4%: overlapping for good, not measured again
    seconds = [2.0, 10 / 4.9, 10 / 4.6, 10 / 4.7, 9.0]
    records, seen, _ = scripted_measure(llada64, ["baseline", "dual"], seconds, monkeypatch, repetitions="auto")
    assert len(seen) == 2 + 4 and [r["repetitions"] for r in records] == [2, 2]
    assert records[1]["speedup_reliable"] is False and "~1.00x" in bench_format.render(records, "md")


def test_auto_repetitions_stop_at_the_most(llada64, one_thread, monkeypatch):
    from fastdllm.bench.rounds import AUTO_MOST

    seconds = [2.0, 0.5, 2.0, 1.0, 0.25, 1.0, 0.25]                          # dual never settles
    records, seen, _ = scripted_measure(llada64, ["baseline", "dual"], seconds, monkeypatch, repetitions="auto")
    assert [r["repetitions"] for r in records] == [2, AUTO_MOST] == [2, 5]
    assert records[1]["speedup_reliable"] is False and len(seen) == 2 + 2 + AUTO_MOST


def test_repetitions_parse_and_data_parallel_auto_is_fixed():
    from fastdllm.bench import rounds
    from fastdllm.errors import UsageError

    assert rounds.parse("auto") == rounds.parse(" AUTO ") == "auto" and rounds.parse("4") == 4
    for bad in ("0", "-1", "2.5", "many"):
        with pytest.raises(UsageError):
            rounds.parse(bad)
    assert rounds.planned("auto") == 2 and rounds.planned("auto", processes=2) == 3 and rounds.planned(4) == 4
    assert rounds.outvoted([10.0, 30.0, 11.0]) == [10.0, 11.0] and rounds.outvoted([1.0, 9.0]) == [1.0, 9.0]


def test_unreliable_when_ranges_overlap_or_a_spread_is_wide():
    from fastdllm.bench.cases import SPREAD_LIMIT
    from fastdllm.bench.rounds import speedup_fields

    assert speedup_fields([10.5, 10.6, 10.8], [10.0, 10.55, 10.7])["speedup_reliable"] is False    # overlap
    assert speedup_fields([10.5, 11.0, 10.8], [10.0, 10.2, 10.6])["speedup_reliable"] is True      # only outvoted ones do
    assert speedup_fields([10.5, 11.0], [10.0, 10.6])["speedup_reliable"] is False                 # two: all count
    assert speedup_fields([11.0, 11.2, 11.1], [10.0, 10.2, 10.1])["speedup_reliable"] is True      # close, apart
    wide = 1 + SPREAD_LIMIT + 0.01
    assert speedup_fields([30.0, 30.0 * wide, 31.0], [10.0, 10.1, 10.2])["speedup_reliable"] is True    # outvoted
    assert speedup_fields([30.0, 31.0 * wide], [10.0, 10.1])["speedup_reliable"] is False              # two: wide
    assert speedup_fields([30.0, 40.0, 52.0], [10.0, 10.1, 10.2])["speedup_reliable"] is False        # kept: 29%
    assert speedup_fields([30.0], [10.0])["speedup_reliable"] is None                               # spread unknown
    assert speedup_fields([30.0, 31.0], [0.0, 0.0])["speedup"] is None


def test_the_footer_says_when_every_answer_ends_inside_the_first_block():
    row = {"gen_len": 1024, "block_len": 32, "early_stop": True, "answer_tokens": 4.2}
    line = bench_format._short_answers([row, dict(row, answer_tokens=3.2)])
    assert line.startswith("every answer ends inside the first block (4.2 tokens at most") and "--no-early-stop" in line
    assert bench_format._short_answers([row, dict(row, answer_tokens=40.0)]) is None      # one row went on
    assert bench_format._short_answers([dict(row, early_stop=False)]) is None              # the whole canvas decoded
    assert bench_format._short_answers([dict(row, gen_len=64)]) is None                    # a short canvas: nothing to say
