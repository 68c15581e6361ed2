"""Issue 39: --dtype auto on a CPU follows the CPU. The choice for every CPU class with simulated
capabilities, the probe's cache, the FASTDLLM_CPU_DTYPE pin, and what info / -v / --json say."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from fastdllm.checkpoints import cpu_dtype, loading, placement
from fastdllm.checkpoints.cpu_dtype import Capabilities, cached_probe, decide
from fastdllm.cli.app import app
from fastdllm.errors import UsageError
from fastdllm.models import cpu

AVX2 = frozenset({"avx", "avx2", "fma"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
AVX512_BF16 = AVX512 | {"avx512_bf16"}
AMX = AVX512_BF16 | {"amx_bf16", "amx_int8", "amx_tile"}


def never():
    raise AssertionError("the probe ran where the flags decide")


def probe_of(bf16_ms, fp32_ms):
    return lambda: (bf16_ms, fp32_ms)


# --- the choice, per CPU class -------------------------------------------------------------------

def test_avx2_only_is_fp32_without_a_probe():
    # oneDNN has no bf16 kernels there (torch emulates bf16): fp32 whatever a probe would say
    choice = decide(Capabilities(AVX2, bf16_native=False), never)
    assert choice.dtype == "fp32" and choice.reason == "fp32: no bf16 kernels on this CPU (emulated)"


@pytest.mark.parametrize("flags", [AVX512, AVX512_BF16], ids=["avx512", "avx512_bf16"])
def test_avx512_follows_the_probe(flags):
    caps = Capabilities(flags, bf16_native=True)
    slower = decide(caps, probe_of(1.9, 1.7))
    assert slower.dtype == "fp32" and slower.reason == "fp32: bf16 not faster here (probe 1.9 ms vs 1.7 ms)"
    faster = decide(caps, probe_of(1.2, 3.0))
    assert faster.dtype == "bf16" and faster.reason == "bf16: faster here (probe 1.2 ms vs 3.0 ms)"
    # within 10% is noise: fp32 keeps its precision
    assert decide(caps, probe_of(1.0, 1.05)).dtype == "fp32"


def test_amx_is_bf16_without_a_probe():
    choice = decide(Capabilities(AMX, bf16_native=True), never)
    assert choice.dtype == "bf16" and choice.reason == "bf16: AMX"


def test_amx_capped_by_onednn_isa_is_probed(monkeypatch):
    # ONEDNN_MAX_CPU_ISA=AVX512_CORE (issue 39's way to simulate a CPU without AMX) hides the tiles
    monkeypatch.setattr(cpu_dtype, "cpu_flags", lambda: AMX)
    monkeypatch.setattr(cpu, "bf16_native", lambda: True)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert not cpu_dtype.this_cpu().amx
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert cpu_dtype.this_cpu().amx


# --- the pin -------------------------------------------------------------------------------------

def test_the_pin_decides_without_detection(monkeypatch):
    monkeypatch.setattr(cpu_dtype, "decide", lambda *a: never())
    monkeypatch.setenv("FASTDLLM_CPU_DTYPE", "bf16")
    assert cpu_dtype.auto_choice() == cpu_dtype.Choice("bf16", "bf16: FASTDLLM_CPU_DTYPE=bf16")
    monkeypatch.setenv("FASTDLLM_CPU_DTYPE", "fp16")
    with pytest.raises(UsageError, match="expected fp32 or bf16"):
        cpu_dtype.auto_choice()


# --- the cache -----------------------------------------------------------------------------------

class Counting:
    def __init__(self, figures=(1.0, 2.0)):
        self.calls, self.figures = 0, figures

    def __call__(self):
        self.calls += 1
        return self.figures


def test_a_second_call_does_not_probe_again(tmp_path, monkeypatch):
    path, measure = tmp_path / "probe.json", Counting()
    assert cached_probe(path, "cpu A", measure) == (1.0, 2.0)
    assert cached_probe(path, "cpu A", measure) == (1.0, 2.0) and measure.calls == 1
    monkeypatch.setattr(cpu_dtype, "_probed", {})          # a new process: the file answers
    assert cached_probe(path, "cpu A", measure) == (1.0, 2.0) and measure.calls == 1
    assert cached_probe(path, "cpu A, 4 threads", measure) and measure.calls == 2   # another key probes
    assert set(json.loads(path.read_text())) == {"cpu A", "cpu A, 4 threads"}


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"cpu A": "fast"}', '{"cpu A": [0, -1]}'])
def test_a_corrupt_cache_is_ignored_and_rewritten(tmp_path, text):
    path, measure = tmp_path / "probe.json", Counting((3.0, 4.0))
    path.write_text(text)
    assert cached_probe(path, "cpu A", measure) == (3.0, 4.0) and measure.calls == 1
    assert json.loads(path.read_text())["cpu A"] == [3.0, 4.0]


def test_an_unwritable_cache_costs_only_the_probe(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cached_probe(blocker / "probe.json", "cpu A", Counting()) == (1.0, 2.0)


def test_the_probe_measures_both_formats_here():
    bf16_ms, fp32_ms = cpu_dtype.measure_linear(rows=4, d_in=64, d_out=128, reps=2)   # tiny: the API, not speed
    assert bf16_ms > 0 and fp32_ms > 0
    assert "threads" in cpu_dtype.probe_key() and torch.__version__ in cpu_dtype.probe_key()


# --- what info, -v and --json say ----------------------------------------------------------------

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def simulated(monkeypatch, tmp_path):
    """Unpin auto, keep the probe's cache out of the user's, and simulate a CPU's flags."""
    monkeypatch.delenv("FASTDLLM_CPU_DTYPE", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("FASTDLLM_CACHE_DIR", str(tmp_path / "cache"))

    real_packing = cpu.packable_dtypes()      # what this process's oneDNN can pack (AVX2-limited in a CI pass)

    def as_cpu(flags, bf16_native):
        monkeypatch.setattr(cpu_dtype, "cpu_flags", lambda: flags)
        monkeypatch.setattr(cpu, "bf16_native", lambda: bf16_native)
        # a simulated CPU changes the decision, not the kernels this process can run
        monkeypatch.setattr(cpu, "packable_dtypes", lambda: real_packing)
    return as_cpu


def test_amx_loads_bf16_and_says_why(llada_dir, simulated):
    simulated(AMX, True)
    lm = loading.load(llada_dir)
    assert lm.dtype == torch.bfloat16 and lm.info["dtype_choice"] == "bf16: AMX"
    record = json.loads(invoke("generate", "-m", llada_dir, "-n", "16", "--block-len", "16", "--json", "hi").stdout)
    assert record["model"]["dtype"] == "bfloat16" and record["model"]["dtype_choice"] == "bf16: AMX"
    r = invoke("generate", "-m", llada_dir, "-n", "16", "--block-len", "16", "-v", "--raw", "hi")
    assert "dtype choice: bf16: AMX" in " ".join(r.stderr.split())
    assert "--dtype auto on CPU bf16: AMX" in " ".join(invoke("info", llada_dir).stdout.split())
    cpu_info = json.loads(invoke("info", llada_dir, "--json").stdout)["cpu"]
    assert cpu_info["auto_dtype"] == "bf16" and cpu_info["auto_dtype_reason"] == "bf16: AMX"


def test_avx2_loads_fp32_and_says_why(llada_dir, simulated):
    simulated(AVX2, False)
    record = json.loads(invoke("generate", "-m", llada_dir, "-n", "16", "--block-len", "16", "--json",
                               "--device", "cpu", "hi").stdout)
    assert record["model"]["dtype"] == "float32" and "bf16" not in record["model"]
    assert record["model"]["dtype_choice"] == "fp32: no bf16 kernels on this CPU (emulated)"


@pytest.mark.parametrize("flags, native, probe, said", [
    (AVX2, False, never, "fp32: no bf16 kernels on this CPU (emulated)"),
    (AVX512, True, probe_of(5.3, 2.7), "fp32: bf16 not faster here (probe 5.3 ms vs 2.7 ms)"),   # AVX-512 without bf16 units
    (AVX512_BF16, True, probe_of(1.4, 3.7), None),
], ids=["avx2", "avx512_core", "avx512_bf16"])
def test_a_given_bf16_is_loaded_and_the_note_says_when_fp32_is_faster(llada_dir, simulated, monkeypatch,
                                                                      flags, native, probe, said):
    simulated(flags, native)
    monkeypatch.setattr(cpu_dtype, "cached_probe", lambda path, key: probe())
    monkeypatch.setenv("FASTDLLM_CPU_DTYPE", "fp32")          # a pin does not change what the note says
    r = invoke("generate", "-m", llada_dir, "-n", "16", "--block-len", "16", "--dtype", "bf16", "--raw", "hi")
    notes = [line for line in r.stderr.splitlines() if line.startswith("note: bf16")]
    expected = [f"note: bf16 is slower than fp32 on this CPU; --dtype auto picks {said}"] if said else []
    assert r.exit_code == 0 and [" ".join(n.split()) for n in notes] == expected
    # int8 / int4 compute in bf16 on purpose: no such note for them
    for quantize in ("int8", "int4"):
        assert placement.bf16_load_note(SimpleNamespace(info={"bf16": "native"}, quantize=quantize)) is None


def test_a_given_dtype_is_not_second_guessed(llada_dir, simulated):
    simulated(AMX, True)
    lm = loading.load(llada_dir, dtype="fp32")
    assert lm.dtype == torch.float32 and "dtype_choice" not in lm.info
