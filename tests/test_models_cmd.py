"""`recommend` on simulated machines, `list` of a --models-dir, `show` of the catalog card: what a
person sees, from the catalog's sizes and the machine's free memory."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from fastdllm.cli.app import app
from fastdllm.checkpoints import catalog, fit
from fastdllm.checkpoints.locate import resolve_model_dir

GIB = 2**30


def machine(monkeypatch, kind: str, gib: float):
    label = "this GPU" if kind == "gpu" else "this machine's RAM"
    monkeypatch.setattr(fit, "this_machine", lambda device="auto": fit.Machine(kind, label, int(gib * GIB)))


def recommended(*args) -> dict[str, dict]:
    out = CliRunner().invoke(app, ["recommend", "--json", *args])
    assert out.exit_code == 0, out.output
    return {m["name"]: m for m in json.loads(out.stdout)["models"]}


def test_a_12_gib_gpu_gets_each_model_in_the_best_form_that_fits(monkeypatch):
    machine(monkeypatch, "gpu", 12)
    found = recommended()
    assert found["sdar:4b-chat"]["flags"] == "--dtype bf16"              # 8.3 GiB + 1 GiB to run
    assert found["dream:7b"]["flags"] == "--quantize 8bit"               # bf16 14.2 GiB does not fit
    assert found["llada2:mini"]["flags"] == "--quantize 4bit"            # 9.4 GiB at 4-bit
    assert "sdar:30b-a3b-chat" not in found and "llada2:flash" not in found    # 16.9 GiB; size unknown
    for name, m in found.items():
        assert m["memory_gib"] + 1 <= 12 and m["profile"] == catalog.entries()[name].profile


def test_a_cpu_is_offered_its_own_kernels_and_never_for_packed_experts(monkeypatch):
    machine(monkeypatch, "cpu", 20)
    found = recommended()
    assert found["dream:7b"]["flags"] == "--dtype bf16" and found["sdar:30b-a3b-chat"]["flags"] == "--quantize int4"
    machine(monkeypatch, "cpu", 24)
    assert "diffusion-gemma:26b-a4b" not in recommended()                # 47.1 GiB bf16; no int4 kernels for it
    everything = recommended("--all")
    assert set(everything) == set(catalog.entries()) and not everything["diffusion-gemma:26b-a4b"]["fits"]


def test_nothing_fits_is_one_line(monkeypatch):
    machine(monkeypatch, "gpu", 2)
    out = CliRunner().invoke(app, ["recommend"])
    assert out.exit_code == 1 and "error: no catalog model fits in 2.0 GiB" in out.output


def test_list_shows_a_models_dir_with_family_and_quantization(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    shutil.copytree(resolve_model_dir(None), tmp_path / "models" / "my-llada")
    (tmp_path / "models" / "notes").mkdir()                              # not a checkpoint: not listed
    out = CliRunner().invoke(app, ["list", "--models-dir", str(tmp_path / "models"), "--json"])
    models = {m["name"]: m for m in json.loads(out.stdout)["models"]}
    assert set(models) == {"tiny-code", "my-llada"}
    assert models["my-llada"]["family"] == "llada" and models["my-llada"]["where"] == "models-dir"
    assert models["my-llada"]["quantization"] == "bf16" and models["my-llada"]["size_bytes"] > 10**6


@pytest.mark.parametrize("name", ["dream:7b", "Dream-org/Dream-v0-Instruct-7B"])
def test_show_prints_the_card(name, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    out = CliRunner().invoke(app, ["show", name])
    assert out.exit_code == 0
    for text in ("dream:7b", "Dream-org/Dream-v0-Instruct-7B", "Apache-2.0", "memory 8bit", "8.1 GiB",
                 "not here: fastdllm pull dream:7b"):
        assert text in out.stdout


def test_show_of_an_unknown_name_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    out = CliRunner().invoke(app, ["show", "someone/something"])
    assert out.exit_code == 1 and out.output.count("\n") == 1 and "neither in the catalog nor here" in out.output


def test_ps_without_a_server_is_one_line():
    import socket

    with socket.socket() as s:                          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = CliRunner().invoke(app, ["ps", "--port", str(port)])
    assert out.exit_code == 1 and out.output.count("\n") == 1
    assert out.output.startswith(f"error: no fastdllm serve at http://127.0.0.1:{port}/api/ps")
