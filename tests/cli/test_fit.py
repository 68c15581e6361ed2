"""The fit verdict (checkpoints/fit.py): on simulated machines, what cannot fit is refused in one
line naming the form that would, before any weight is read; --force loads anyway."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fastdllm.checkpoints.builtin import builtin_model_path
from fastdllm.cli.app import app
from fastdllm.checkpoints import catalog, fit
from fastdllm.checkpoints.locate import resolve_model_dir
from fastdllm.errors import UsageError

GIB = 2**30
DREAM = catalog.entries()["dream:7b"]
# dream:7b's totals as the catalog holds them (weights + a 384-token bf16 cache)
TOTALS = fit.with_float_widths({p: {"total": int(DREAM.memory_gib(p) * GIB)} for p in catalog.PRECISIONS})


def test_what_fits_is_not_refused():
    assert fit.refusal("dream:7b", TOTALS, "bf16", fit.Machine("gpu", "this GPU", 24 * GIB)) is None


def test_a_gpu_too_small_for_bf16_is_told_the_quantization_that_fits():
    line = fit.refusal("dream:7b", TOTALS, "bf16", fit.Machine("gpu", "this GPU", int(11.7 * GIB)))
    assert line == ("dream:7b needs 14.2 GiB at bf16; this GPU has 11.7 GiB free: try --quantize 8bit (8.1 GiB), "
                    "or --force to load anyway")
    # 8 GiB free: 8-bit (8.1 + 1 GiB headroom) does not fit either, 4-bit does
    assert "try --quantize 4bit (5.5 GiB)" in fit.refusal("dream:7b", TOTALS, "8bit", fit.Machine("gpu", "cuda:1", 8 * GIB))


def test_nothing_fits_says_so():
    line = fit.refusal("dream:7b", TOTALS, "bf16", fit.Machine("gpu", "this GPU", 4 * GIB))
    assert "even the smallest form needs 5.5 GiB" in line and "fastdllm recommend" in line


def test_a_cpu_is_offered_bf16_then_its_int8_and_int4_kernels():
    ram = fit.Machine("cpu", "this machine's RAM", 20 * GIB)
    assert fit.chosen_key("cpu", "auto", "none") == "fp32" and fit.chosen_key("gpu", "auto", "none") == "bf16"
    assert "try --dtype bf16 (14.2 GiB)" in fit.refusal("dream:7b", TOTALS, "fp32", ram)
    int8 = dict(TOTALS, int8=int(7.9 * GIB), int4=int(4.9 * GIB))
    assert "try --quantize int8 (7.9 GiB)" in fit.refusal("dream:7b", int8, "fp32", fit.Machine("cpu", "this machine's RAM", 10 * GIB))
    # packed experts (DiffusionGemma) cannot take the CPU kernels: never offered
    assert "int" not in fit.refusal("dream:7b", int8, "fp32", fit.Machine("cpu", "RAM", 10 * GIB), packed_experts=True)


def test_the_estimate_of_a_checkpoint_is_read_from_its_headers():
    totals, packed, cache, layers = fit.estimate(resolve_model_dir(None), 384)
    assert not packed and totals["fp32"] == 2 * totals["bf16"] > totals["int8"] > 0
    assert 0 < cache < totals["bf16"] and layers > 0


@pytest.fixture
def small_machine(monkeypatch):
    monkeypatch.setattr(fit, "this_machine", lambda device="auto": fit.Machine("cpu", "this machine's RAM", 512 * 2**20))


def test_generate_refuses_in_one_line_before_loading_and_force_loads(small_machine, monkeypatch):
    from fastdllm.checkpoints import loading

    calls = []
    monkeypatch.setattr(loading, "load", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(SystemExit(3)))
    out = CliRunner().invoke(app, ["generate", "hi", "-n", "32"])
    assert out.exit_code == 1 and calls == []
    assert out.output.startswith(f"error: {builtin_model_path().name} needs ") and out.output.count("\n") == 1
    assert "this machine's RAM has 0.5 GiB free" in out.output
    forced = CliRunner().invoke(app, ["generate", "hi", "-n", "32", "--force"])
    assert calls and forced.exit_code == 3                   # it went on to load


def test_fastdllm_force_is_the_same_as_the_flag(small_machine, monkeypatch):
    from fastdllm.checkpoints import loading

    monkeypatch.setattr(loading, "load", lambda *a, **k: (_ for _ in ()).throw(SystemExit(3)))
    monkeypatch.setenv("FASTDLLM_FORCE", "1")
    assert CliRunner().invoke(app, ["generate", "hi", "-n", "32"]).exit_code == 3


# --- the split the verdict proposes (checkpoints/fit_split.py), on described machines -----------

CACHE = int(0.05 * GIB)           # dream:7b's 384-token canvas cache, about


def test_a_described_machine_is_what_the_flags_say():
    two = fit.described("2x24GiB", "64GiB")
    assert (two.kind, two.gpus, two.ram, two.label) == ("gpu", (24 * GIB, 24 * GIB), 64 * GIB, "2x 24.0 GiB GPUs")
    assert fit.described("24GiB,16GiB", "8GB").gpus == (24 * GIB, 16 * GIB)
    cpu = fit.described("none", "16GiB")
    assert (cpu.kind, cpu.gpus, cpu.free_bytes) == ("cpu", (), 16 * GIB)
    with pytest.raises(UsageError, match="--assume-gpus: 'twox24gb' \\(expected COUNTxSIZE"):
        fit.described("twox24GB", None)


def test_two_gpus_hold_what_one_cannot_and_say_how_much_each():
    two = fit.described("2x12GiB", "64GiB")
    assert fit.refusal("dream:7b", TOTALS, "bf16", two, cache=CACHE, layers=28) is None
    line = fit.verdict("dream:7b", TOTALS, "bf16", two, cache=CACHE, layers=28)
    assert line.startswith("fits at bf16 over 2 GPUs: ") and line.endswith(" GiB (--device-map balanced)")
    shares = [float(x) for x in line.split(": ")[1].split(" GiB")[0].split(" + ")]
    assert abs(sum(shares) - 14.2) < 0.2 and all(s < 11 for s in shares)


def test_one_gpu_too_small_is_told_the_quantization_and_the_gpu_plus_cpu_split():
    line = fit.refusal("dream:7b", TOTALS, "bf16", fit.described("1x12GiB", "64GiB"), cache=CACHE, layers=28)
    assert "try --quantize 8bit (8.1 GiB), or split it: GPU " in line
    assert " crosses per step (--max-memory 0=" in line and ",cpu=63.0GiB), or --force" in line
    # too little RAM as well: the rest goes to disk
    tight = fit.refusal("dream:7b", TOTALS, "bf16", fit.described("1x8GiB", "4GiB"), cache=CACHE, layers=28)
    assert "+ disk " in tight and "of it read from disk" in tight and ",cpu=3.0GiB,disk)" in tight


def test_a_cpu_without_the_ram_is_told_the_disk_split():
    line = fit.refusal("dream:7b", TOTALS, "fp32", fit.described("none", "8GiB"), cache=CACHE, layers=28)
    assert ": split it: CPU " in line and "read from disk per step (--max-memory cpu=" in line


def test_the_proposed_flags_are_valid_flags():
    from fastdllm.checkpoints.split import split_of

    for gpus, ram, key in (("1x12GiB", "64GiB", "bf16"), ("1x8GiB", "4GiB", "bf16"), ("none", "8GiB", "fp32")):
        line = fit.refusal("dream:7b", TOTALS, key, fit.described(gpus, ram), cache=CACHE, layers=28)
        memory = line.split("(--max-memory ")[1].split(")")[0]
        assert split_of("auto", None, memory).budgets


def test_the_proposal_loads_and_decodes_as_the_whole_model(tmp_path):
    """The built-in model on a described CPU with 16 MiB past the headroom: the refusal proposes
    a disk split; its flags load the model split (accelerate's plan), and it decodes the same."""
    from fastdllm.checkpoints import loading
    from fastdllm.decode.config import DecodeConfig
    from fastdllm.decode.engine import run

    path = resolve_model_dir(None)
    line = fit.check(path, "tiny", dtype="fp32", device="cpu", quantize="none", canvas_tokens=64,
                     machine=fit.described("none", f"{1024 + 16}MiB"))
    assert "split it: CPU " in line and "read from disk per step" in line
    memory = line.split("(--max-memory ")[1].split(")")[0]
    split = loading.load(path, dtype="fp32", device="cpu", max_memory=memory)
    assert "disk" in split.model.hf_device_map.values()
    whole = loading.load(path, dtype="fp32", device="cpu")
    cfg = DecodeConfig(gen_len=16, block_len=8, rule="threshold", threshold=0.9)
    prompt = [whole.encode("def add(a, b):", chat=False)]
    assert run(split.decoder, prompt, cfg).ids == run(whole.decoder, prompt, cfg).ids


def test_info_and_recommend_judge_a_described_machine():
    out = CliRunner().invoke(app, ["info", "--assume-gpus", "none", "--assume-ram", f"{1024 + 24}MiB"])
    assert out.exit_code == 0, out.output
    row = next(line for line in out.output.splitlines() if line.startswith("placement"))
    assert "split it: CPU " in row and "--max-memory cpu=" in row
    found = CliRunner().invoke(app, ["recommend", "--json", "--assume-gpus", "2x12GiB", "--assume-ram", "64GiB"])
    models = {m["name"]: m for m in json.loads(found.stdout)["models"]}
    assert models["llada:8b-instruct"]["split"].startswith("2 GPUs: ")
    assert models["llada:8b-instruct"]["flags"] == "--dtype bf16"
    cpu = CliRunner().invoke(app, ["recommend", "--json", "--assume-gpus", "none", "--assume-ram", "16GiB"])
    rnd1 = {m["name"]: m for m in json.loads(cpu.stdout)["models"]}["rnd1:30b-a3b"]
    assert rnd1["fits"] and rnd1["flags"].startswith("--max-memory cpu=") and "disk" in rnd1["split"]
