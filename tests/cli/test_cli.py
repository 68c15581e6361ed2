"""`fastdllm generate`, `info`, `profiles`: flags, output modes, precedence, errors."""

from __future__ import annotations

import json
import sys

import pytest
from cli_runner import invoke
from helpers import SMALL




pytestmark = pytest.mark.sweep   # each test's first case in the fast lane, the rest in the full suite (tests/conftest.py)


def test_generate_prints_answer_and_stats(llada_dir):
    r = invoke("generate", "-m", llada_dir, *SMALL, "--threshold", "0.5", "Hello there")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.endswith("\n") and len(r.stdout.strip()) > 0
    assert "forwards" in r.stderr and "tok/s" in r.stderr and "peak" in r.stderr


def test_json_is_one_object_with_the_documented_fields(llada_dir):
    r = invoke("generate", "-m", llada_dir, *SMALL, "--json", "--raw", "def f(x):")
    assert r.exit_code == 0
    record = json.loads(r.stdout)              # exactly one JSON document on stdout
    for key in ("text", "ids", "prompt_tokens", "generated_tokens", "nfe", "tokens_per_forward",
                "tokens_per_second", "timings", "peak_memory_bytes", "cache_bytes", "config", "model", "profile"):
        assert key in record
    assert set(record["timings"]) == {"load_s", "first_step_s", "total_s"}
    assert record["config"]["gen_len"] == 32 and record["config"]["block_len"] == 16
    assert record["profile"] == "default" and record["model"]["family"] == "llada"
    assert record["generated_tokens"] == len(record["ids"])


def test_prompt_from_stdin_and_file(llada_dir, tmp_path):
    via_stdin = invoke("generate", "-m", llada_dir, *SMALL, "--json", input="Hello there")
    prompt_file = tmp_path / "p.txt"
    prompt_file.write_text("Hello there")
    via_file = invoke("generate", "-m", llada_dir, *SMALL, "--json", "-f", prompt_file)
    via_dash = invoke("generate", "-m", llada_dir, *SMALL, "--json", "-", input="Hello there")
    texts = {json.loads(r.stdout)["text"] for r in (via_stdin, via_file, via_dash)}
    assert len(texts) == 1


def test_chat_template_applied_by_default_and_raw_skips_it(llada_dir):
    chat = json.loads(invoke("generate", "-m", llada_dir, *SMALL, "--json", "Hi").stdout)
    raw = json.loads(invoke("generate", "-m", llada_dir, *SMALL, "--json", "--raw", "Hi").stdout)
    assert chat["prompt_tokens"] > raw["prompt_tokens"] + 5


def test_pipe_streams_block_by_block(llada64):
    """When stdout is not a terminal the answer is written as blocks finish, not at the end."""
    import io

    from fastdllm.decode.config import DecodeConfig
    from fastdllm.decode.engine import BlockEvent, Result, generate
    from fastdllm.terminal.view import BlockStreamer

    class Recorder(io.StringIO):
        def __init__(self):
            super().__init__()
            self.chunks = []

        def write(self, s):
            self.chunks.append((self.blocks_seen, s))
            return super().write(s)

    out = Recorder()
    out.blocks_seen = 0
    streamer = BlockStreamer(out, llada64.tokenizer, ())          # no end token: every block streams
    prompt = llada64.encode("Hello there", chat=True)
    for event in generate(llada64.decoder, [prompt], DecodeConfig(gen_len=32, block_len=8, early_stop=False)):
        if isinstance(event, BlockEvent):
            out.blocks_seen += 1
            streamer.update(event)
        elif isinstance(event, Result):
            result = event
    streamer.finish(result)
    written_during = {blocks for blocks, s in out.chunks if s}
    assert len(written_during) >= 3                                 # text arrived with several blocks
    assert out.getvalue() == llada64.tokenizer.decode(result.canvas[0].tolist(), skip_special_tokens=True) + "\n"


def test_live_view_renders_placeholders_highlights_and_footer(llada64):
    from rich.console import Console

    from fastdllm.decode.config import DecodeConfig
    from fastdllm.decode.engine import StepEvent, generate
    from fastdllm.terminal.view import MASK_GLYPH, LiveCanvas

    console = Console(record=True, width=100, height=40, force_terminal=True, file=open("/dev/null", "w"))
    view = LiveCanvas(console, llada64.tokenizer, "tiny · profile default", 32, 16, llada64.specials.stops)
    prompt = llada64.encode("Hello there", chat=True)
    cfg = DecodeConfig(gen_len=32, block_len=16, threshold=0.6, early_stop=False)
    with view:
        for event in generate(llada64.decoder, [prompt], cfg):
            if isinstance(event, StepEvent):
                view.update(event)
                if event.block == 1 and event.step == 1:
                    break
    header, body, footer = view.render().renderables
    assert header.plain.startswith("tiny")
    assert MASK_GLYPH in body.plain and "16 masked" not in body.plain        # last block: no suffix left
    styles = {str(span.style) for span in body.spans}
    assert styles & {"bold green", "bold yellow", "bold red"}                # latest commits by confidence
    assert f"block 2/2 · step 2 · NFE {view.nfe}" in footer.plain and "tok/s" in footer.plain
    assert view.overhead > 0


def test_profiles_list_and_show(tmp_path):
    r = invoke("profiles", "list")
    for name in ("default", "code", "chat", "math", "quality", "fast", "baseline"):
        assert name in r.stdout
    r = invoke("profiles", "show", "code", "--resolved")
    assert "block_len: 32" in r.stdout and "threshold: 0.8" in r.stdout and "gen_len: 128" in r.stdout   # built-in model


def test_precedence_flag_over_env_over_profile(llada_dir, tmp_path):
    profile = tmp_path / "mine.yaml"
    profile.write_text("description: test\nthreshold: 0.6\nblock_len: 16\ngen_len: 32\n")
    run = lambda *extra, env=None: json.loads(invoke("generate", "-m", llada_dir, "-P", profile, "--json",
                                                       *extra, "Hi", env=env).stdout)["config"]
    assert run()["threshold"] == 0.6                                            # profile
    assert run(env={"FASTDLLM_THRESHOLD": "0.7"})["threshold"] == 0.7          # env > profile
    assert run("--threshold", "0.8", env={"FASTDLLM_THRESHOLD": "0.7"})["threshold"] == 0.8   # flag > env
    assert run()["cache"] == "dual"                                             # built-in default


def test_user_profile_dir(tmp_path, llada_dir):
    (tmp_path / "speedy.yaml").write_text("description: mine\nrule: factor\nfactor: 2.0\n")
    env = {"FASTDLLM_PROFILE_DIR": str(tmp_path)}
    assert "speedy" in invoke("profiles", "list", env=env).stdout
    r = invoke("profiles", "show", "speedy", "--resolved", env=env)
    assert "rule: factor" in r.stdout and "factor: 2.0" in r.stdout


@pytest.mark.parametrize("content, message", [
    ("treshold: 0.5\n", "unknown key 'treshold' (did you mean 'threshold'?)"),
    ("threshold: high\n", "threshold: expected float"),
    ("threshold: 1.5\n", "threshold: 1.5 is above the maximum 1.0"),
    ("cache: both\n", "cache: 'both' is not one of"),
    ("- a list\n", "expected a mapping"),
])
def test_invalid_profiles_name_file_key_and_reason(tmp_path, content, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    r = invoke("profiles", "show", bad)
    assert r.exit_code == 2
    assert str(bad) in r.stderr and message in r.stderr.replace("\n", "")


@pytest.mark.parametrize("args, code, message", [
    (["-m", "/nonexistent/model", "hi"], 1, "model directory not found"),
    (["--cache", "both", "hi"], 2, "cache: 'both' is not one of"),
    (["-n", "33", "hi"], 2, "gen_len 33 is not a multiple of block_len 32"),
    (["--threshold", "0", "hi"], 2, "threshold: 0.0 must be greater than 0"),
    (["-P", "nope", "hi"], 2, "unknown profile 'nope'"),
    (["--dtype", "fp8", "hi"], 2, "unknown dtype"),
    (["-n", "4096", "hi"], 1, "exceeds the model's context"),
    (["-m", "someone/some-model", "hi"], 1, "--model DIR"),
])
def test_errors_are_one_line_with_exit_codes(llada_dir, args, code, message):
    if "-m" not in args:
        args = ["-m", str(llada_dir)] + args
    r = invoke("generate", *args, env={"HF_HUB_OFFLINE": "1"})
    assert r.exit_code == code, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1


def test_no_prompt_is_a_usage_error(llada_dir, monkeypatch):
    monkeypatch.setattr("fastdllm.cli.text_input.is_terminal", lambda stream: True)   # as if stdin were a terminal
    r = invoke("generate", "-m", llada_dir)
    assert r.exit_code == 2 and "no prompt" in r.stderr


def test_quantize_without_bitsandbytes(llada_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)      # import fails as if not installed
    r = invoke("generate", "-m", llada_dir, "--quantize", "8bit", "hi")
    assert r.exit_code == 1 and "needs bitsandbytes" in r.stderr


def test_ctrl_c_exits_130_without_a_complete_answer(llada_dir, monkeypatch):
    import fastdllm.decode.engine as engine

    real = engine.generate

    def interrupted(*args, **kwargs):
        for i, event in enumerate(real(*args, **kwargs)):
            if i == 3:
                raise KeyboardInterrupt
            yield event

    monkeypatch.setattr(engine, "generate", interrupted)
    r = invoke("generate", "-m", llada_dir, *SMALL, "hi")
    assert r.exit_code == 130 and "interrupted" in r.stderr
    assert not r.stdout.endswith("\n")                    # no final newline: not presented as complete
    assert "tok/s" not in r.stderr


def test_debug_shows_the_traceback():
    with pytest.raises(Exception, match="model directory not found"):
        invoke("--debug", "generate", "-m", "/nonexistent", "hi")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_quantized_8bit_and_4bit_on_cpu(family, request):
    if family == "llada":
        path = request.getfixturevalue("llada_dir")
    else:  # bitsandbytes' CPU 4-bit kernel needs rows of at least its block size (64)
        from conftest import VARIED

        path = request.getfixturevalue("tiny")("dream", hidden_size=64, intermediate_size=128, **VARIED)
    sizes = {}
    for quantize in ("none", "8bit", "4bit"):
        r = invoke("generate", "-m", path, *SMALL, "--json", "--quantize", quantize, "--dtype", "bf16", "Hi")
        assert r.exit_code == 0, r.stderr
        record = json.loads(r.stdout)
        assert record["model"]["quantize"] == quantize and record["nfe"] >= 2
        sizes[quantize] = record["model"]["weights_bytes"]
    assert sizes["4bit"] < sizes["8bit"] < sizes["none"]


def test_info(llada_dir, dream_dir):
    r = invoke("info", llada_dir, "--json")
    data = json.loads(r.stdout)
    assert data["family"] == "llada" and data["chat_template"] is True
    assert data["memory"]["4bit"]["weights"] < data["memory"]["8bit"]["weights"] < data["memory"]["bf16"]["weights"]
    r = invoke("info", dream_dir)
    assert "151666" in r.stdout and "151645" in r.stdout and "Dream" in r.stdout


def test_info_on_a_directory_without_weights_is_one_line(llada_dir, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(llada_dir / "config.json", bare / "config.json")        # a download that stopped early
    r = invoke("info", bare)
    assert r.exit_code == 1 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "no weights to read" in r.stderr and "model.safetensors" in r.stderr
