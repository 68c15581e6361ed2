"""Issue 12: every CPU, every byte of input, every pipe. Each test here failed before its fix."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from typer.testing import CliRunner

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.builtin import builtin_model_path
from fastdllm.decode.profiles import model_defaults
from fastdllm.units import plural
from fastdllm.cli.app import app
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.models import cpu

runner = CliRunner()
SMALL = ["-n", "32", "--block-len", "16"]


pytestmark = pytest.mark.sweep   # each test's first case in the fast lane, the rest in the full suite (tests/conftest.py)


def invoke(*args, input=None, env=None):
    return runner.invoke(app, [str(a) for a in args], input=input, env=env, catch_exceptions=False)


def packed(lm) -> int:
    return sum(p.is_mkldnn for p in lm.model.parameters())


# --- 1. every CPU --------------------------------------------------------------------------------

def test_bf16_without_native_units_loads_plain_and_says_emulated(llada_dir, monkeypatch):
    monkeypatch.setattr(cpu, "bf16_native", lambda: False)       # as on an AVX2-only CPU
    lm = loading.load(llada_dir, dtype="bf16")
    assert packed(lm) == 0 and lm.info["bf16"] == "emulated"
    r = invoke("generate", "-m", llada_dir, *SMALL, "--dtype", "bf16", "-v", "--raw", "def f(x):")
    assert r.exit_code == 0, r.stderr
    dtype_line = next(line for line in r.stderr.splitlines() if line.startswith("device / dtype:"))
    assert "bfloat16" in dtype_line and "emulated" in dtype_line
    assert f", {plural(torch.get_num_threads(), 'thread')})" in dtype_line
    assert lm.info["threads"] == torch.get_num_threads()
    assert "emulated" in invoke("info", llada_dir).stdout
    assert json.loads(invoke("info", llada_dir, "--json").stdout)["cpu"]["bf16_native"] is False


def test_cpu_default_dtype_is_fp32_in_the_suite(llada_dir):
    # auto follows the CPU (tests/quant/test_cpu_dtype.py: bf16 on AMX or where a probe finds it faster);
    # conftest pins it to fp32, so that the suite's tolerances hold on every CI machine class
    record = json.loads(invoke("generate", "-m", llada_dir, *SMALL, "--json", "--device", "cpu", "hi").stdout)
    assert record["model"]["dtype"] == "float32" and "bf16" not in record["model"]
    assert record["model"]["dtype_choice"] == "fp32: FASTDLLM_CPU_DTYPE=fp32"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_packed_and_plain_layouts_give_identical_tokens(llada_dir, dtype):
    if (torch.bfloat16 if dtype == "bf16" else torch.float32) not in cpu.packable_dtypes():
        pytest.skip(f"this CPU ({cpu.capability()}) has no oneDNN {dtype} kernels: only the plain layout runs")
    lm_packed = loading.load(llada_dir, dtype=dtype)
    lm_plain = loading.load(llada_dir, dtype=dtype, pack_weights=False)
    assert packed(lm_packed) > 0 and packed(lm_plain) == 0
    cfg = DecodeConfig(gen_len=32, block_len=16, threshold=0.6, early_stop=False)
    prompt = lm_plain.encode("def f(x):", chat=False)
    a, b = run(lm_packed.decoder, [prompt], cfg), run(lm_plain.decoder, [prompt], cfg)
    assert a.canvas.tolist() == b.canvas.tolist() and a.nfe == b.nfe


# --- 2. error text is text -----------------------------------------------------------------------

@pytest.mark.parametrize("args, shown", [
    (["generate", "-m", "/tmp/no[/x]dir", "hi"], "/tmp/no[/x]dir"),
    (["generate", "-P", "[/x]", "hi"], "unknown profile '[/x]'"),
    (["info", "/tmp/[bold]x"], "/tmp/[bold]x"),
])
def test_user_text_in_errors_is_never_markup(args, shown):
    r = invoke(*args)
    assert r.exit_code in (1, 2) and shown in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_missing_bitsandbytes_hint_keeps_the_extra(llada_dir, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "bitsandbytes", None)
    r = invoke("generate", "-m", llada_dir, "--quantize", "4bit", "hi")
    assert r.exit_code == 1 and "pip install 'fastdllm[quant]'" in r.stderr


# --- 3. any bytes as a prompt --------------------------------------------------------------------

def test_invalid_utf8_is_one_line_naming_the_offset_for_every_input(llada_dir, tmp_path):
    bad = b"def f(\xff):"
    prompt_file = tmp_path / "p.txt"
    prompt_file.write_bytes(bad)
    runs = {"stdin": invoke("generate", "-m", llada_dir, *SMALL, input=bad),
            "argument": invoke("generate", "-m", llada_dir, *SMALL, os.fsdecode(bad)),  # as Python decodes argv
            "file": invoke("generate", "-m", llada_dir, *SMALL, "-f", prompt_file)}
    for source, r in runs.items():
        assert r.exit_code == 1, source
        assert r.stderr.strip().endswith("is not valid UTF-8: byte 0xff at offset 6"), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


def test_chat_skips_an_undecodable_piped_line(llada_dir):
    r = invoke("chat", "-m", llada_dir, *SMALL, input=b"caf\xe9\nhello\n")
    assert r.exit_code == 0
    assert "this input line is not valid UTF-8: byte 0xe9 at offset 3" in r.stderr
    assert r.stderr.count("tok/s") == 1                  # the good line was answered


# --- 4. pipes and files get whole lines ----------------------------------------------------------

@pytest.mark.parametrize("name", ["baseline", "chat", "code", "default", "fast", "fast-dllm-v2", "math", "quality", "sdar"])
def test_profiles_show_round_trips_through_a_file(name, tmp_path):
    shown = invoke("profiles", "show", name)
    copy = tmp_path / "my.yaml"
    copy.write_text(shown.stdout)
    from fastdllm.decode import profiles

    original, reloaded = profiles.find(name), profiles.find(str(copy))
    assert reloaded.values == original.values and reloaded.description == original.description
    resolved = lambda p: invoke("profiles", "show", p, "--resolved").stdout.split("\n", 1)[1]   # noqa: E731
    assert resolved(copy) == resolved(name)


def test_info_prints_whole_paths_in_a_pipe(llada_dir, tmp_path):
    deep = tmp_path / ("a-rather-long-folder-name-" * 4) / "tiny-llada"
    deep.parent.mkdir()
    deep.symlink_to(llada_dir)
    r = invoke("info", deep)
    path_line = next(line for line in r.stdout.splitlines() if line.startswith("path "))
    assert path_line.split(None, 1)[1] == str(deep)                             # whole, on one line
    assert all(line == line.rstrip() for line in r.stdout.splitlines())     # no padding to a width


def test_stats_block_keeps_one_figure_per_line(llada_dir, monkeypatch):
    monkeypatch.setattr(cpu, "bf16_native", lambda: False)        # the longest line: the emulation note
    r = invoke("generate", "-m", llada_dir, *SMALL, "-v", "--raw", "--dtype", "bf16", "hi")
    lines = r.stderr.splitlines()
    stats = lines[next(i for i, line in enumerate(lines) if line.startswith("load time:")):]
    assert len(stats) >= 12 and all(re.match(r"^[A-Za-z /()]+: +\S", line) for line in stats), stats
    assert max(map(len, stats)) > 80                               # not wrapped at 80 columns


# --- 5. bench never throws away a sweep ----------------------------------------------------------

BENCH = ["bench", "-n", "16", "--block-len", "8", "-c", "baseline,dual,dual+parallel", "--n-prompts", "1",
         "--warmup", "0", "-r", "1"]


@pytest.mark.parametrize("where", ["missing/r.jsonl", "."])
def test_bench_output_that_cannot_be_written_is_refused_before_loading(llada_dir, tmp_path, monkeypatch, where):
    import fastdllm.cli.bench as cli_bench

    monkeypatch.setattr(cli_bench, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    r = invoke(*BENCH, "-m", llada_dir, "--format", "jsonl", "--output", tmp_path / where)
    assert r.exit_code == 2 and "--output" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("failure, code", [(KeyboardInterrupt, 130), (RuntimeError, None)])
def test_bench_rows_are_on_disk_as_they_finish_and_kept_on_failure(llada_dir, tmp_path, monkeypatch, failure, code):
    from fastdllm.bench import runner as bench

    out, real_measure, seen = tmp_path / "r.jsonl", bench.measure_share, []

    def failing_after_two(*args, **kwargs):
        for m in real_measure(*args, **kwargs):
            seen.append([json.loads(line)["config"] for line in out.read_text().splitlines()] if out.exists() else [])
            if len(seen) == 3:
                raise failure("out of memory")
            yield m

    monkeypatch.setattr(bench, "measure_share", failing_after_two)
    if code is None:
        with pytest.raises(RuntimeError):
            invoke(*BENCH, "-m", llada_dir, "--output", out)
    else:
        assert invoke(*BENCH, "-m", llada_dir, "--output", out).exit_code == code
    assert seen == [[], ["baseline"], ["baseline", "dual"]]          # each row written when it finished
    assert [json.loads(line)["config"] for line in out.read_text().splitlines()] == ["baseline", "dual"]


# --- 6. what you see is what runs ----------------------------------------------------------------

def test_profiles_resolved_without_model_uses_the_model_generate_uses(llada_dir):
    builtin = invoke("profiles", "show", "code", "--resolved", env={"FASTDLLM_MODEL": None}).stdout
    default_len = model_defaults(builtin_model_path())["gen_len"]      # its generation_config.json
    assert f"gen_len: {default_len}" in builtin and builtin_model_path().name in builtin
    record = json.loads(invoke("generate", "--json", "-P", "code", "hi", env={"FASTDLLM_MODEL": None}).stdout)
    assert record["config"]["gen_len"] == default_len
    chosen = invoke("profiles", "show", "code", "--resolved", env={"FASTDLLM_MODEL": str(llada_dir)}).stdout
    assert "gen_len: 256" in chosen                                    # FASTDLLM_MODEL, as generate would


# --- 7. invalid numbers are refused --------------------------------------------------------------

@pytest.mark.parametrize("args, env, message", [
    (["--threshold", "nan"], None, "threshold: expected a finite number, got nan"),
    (["--factor", "inf"], None, "factor: expected a finite number, got inf"),
    (["--temperature", "-inf"], None, "temperature: expected a finite number"),
    ([], {"FASTDLLM_THRESHOLD": "NaN"}, "environment: threshold: expected a finite number"),
    (["--dtype", "fp8"], None, "--dtype: unknown dtype 'fp8'"),
    (["--device", "tpu"], None, "--device: unknown device 'tpu'"),
    (["--quantize", "2bit"], None, "--quantize: unknown quantize '2bit'"),
    ([], {"FASTDLLM_DTYPE": "half"}, "FASTDLLM_DTYPE: unknown dtype 'half'"),
])
def test_invalid_numbers_and_placements_are_usage_errors(llada_dir, args, env, message):
    r = invoke("generate", "-m", llada_dir, *args, "hi", env=env)
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_nan_in_a_profile_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("factor: .inf\n")
    r = invoke("profiles", "show", bad)
    assert r.exit_code == 2 and "factor: expected a finite number, got inf" in r.stderr


# --- 8. --debug after the subcommand -------------------------------------------------------------

@pytest.mark.parametrize("args", [["generate", "--debug", "-m", "/nonexistent", "hi"],
                                  ["info", "/nonexistent", "--debug"],
                                  ["profiles", "show", "nope", "--debug"]])
def test_debug_after_the_subcommand_shows_the_traceback(args):
    with pytest.raises(Exception, match="not found|unknown profile"):
        runner.invoke(app, args, catch_exceptions=False)
    assert invoke("info", "/nonexistent").exit_code == 1                # and it does not stick


# --- 9. the live view stays readable -------------------------------------------------------------

def test_live_view_draws_end_of_text_padding_as_one_dim_symbol(llada64):
    from rich.console import Console

    from fastdllm.terminal.view import END_GLYPH, MASK_GLYPH, LiveCanvas

    console = Console(width=100, height=40, force_terminal=True, file=open(os.devnull, "w"))
    stop = llada64.specials.stops[0]
    view = LiveCanvas(console, llada64.tokenizer, "tiny", 32, 16, llada64.specials.stops)
    view.tokens[:16] = [300, 301] + [stop] * 10 + [None] * 4             # answer, padding, masks
    _, body, _ = view.render().renderables
    assert END_GLYPH * 10 + MASK_GLYPH * 4 in body.plain
    assert llada64.tokenizer.decode([stop]) not in body.plain
    assert {str(s.style) for s in body.spans if body.plain[s.start:s.end] == END_GLYPH * 10} <= {"dim"}


def test_keys_are_not_echoed_while_the_model_loads(llada_dir, monkeypatch):
    termios = pytest.importorskip("termios")
    from fastdllm.cli import model as cli_model

    controller, terminal = os.openpty()
    with open(terminal, "r") as tty:
        monkeypatch.setattr("sys.stdin", tty)
        echo = lambda: bool(termios.tcgetattr(terminal)[3] & termios.ECHO)   # noqa: E731
        before, real_load, during = echo(), loading.load, []
        monkeypatch.setattr(loading, "load", lambda *a, **k: during.append(echo()) or real_load(*a, **k))
        cli_model.load_model(llada_dir, dtype="fp32", device="cpu", quantize="none")
        assert before and during == [False] and echo()                  # off while loading, then restored
    os.close(controller)
