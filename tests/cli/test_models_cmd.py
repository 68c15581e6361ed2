"""`recommend` on simulated machines, `list` of a --models-dir, `show` of the catalog card: what a
person sees, from the catalog's sizes and the machine's free memory."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from fastdllm.checkpoints.builtin import builtin_models
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
    assert set(models) == {*(p.name for p in builtin_models()), "my-llada"}
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
    assert out.exit_code == 1 and out.output.count("\n") == 1
    assert "neither in the catalog (`fastdllm recommend --all`) nor here (`fastdllm list`)" in out.output


@pytest.mark.parametrize("command", ["show", "pull"])
def test_an_unknown_name_points_at_recommend_all_and_a_family_at_its_tags(command):
    out = CliRunner().invoke(app, [command, "nosuch:model"])
    assert out.exit_code == 2 and out.output.count("\n") == 1
    assert out.output.rstrip().endswith("(`fastdllm recommend --all` lists them all)")
    out = CliRunner().invoke(app, [command, "diffusion-gemma"])
    assert out.output == ("error: unknown model 'diffusion-gemma': try diffusion-gemma:26b-a4b "
                          "(`fastdllm recommend --all` lists them all)\n")


def test_recommend_all_says_size_unknown_and_what_a_model_that_does_not_fit_needs(monkeypatch):
    machine(monkeypatch, "cpu", 24)
    found = recommended("--all")
    assert found["nemotron-diffusion:3b"]["fits"] is None and found["nemotron-diffusion:3b"]["memory_gib"] is None
    gemma = found["diffusion-gemma:26b-a4b"]                             # on a CPU: bf16 only
    assert gemma["fits"] is False and gemma["form"] == "bf16" and gemma["memory_gib"] == 47.1
    out = CliRunner().invoke(app, ["recommend", "--all"])
    rows = {line.split()[0]: " ".join(line.split()) for line in out.stdout.splitlines()}
    assert "size unknown unknown -P nemotron-diffusion" in rows["nemotron-diffusion:3b"]
    assert "does not fit 47.1 GiB at bf16 -P diffusion-gemma" in rows["diffusion-gemma:26b-a4b"]
    assert "note: diffusion-gemma:26b-a4b: bf16 only on a CPU" in out.stderr
    machine(monkeypatch, "gpu", 16)                                      # bitsandbytes' 4bit: 14.3 GiB
    assert recommended()["diffusion-gemma:26b-a4b"]["flags"] == "--quantize 4bit"


def test_show_marks_the_forms_a_cpu_cannot_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    out = CliRunner().invoke(app, ["show", "diffusion-gemma:26b-a4b"])
    assert "memory 4bit  14.3 GiB (384-token canvas; GPU only: the CPU's int8/int4 leave packed experts)" in out.stdout
    assert "memory bf16  47.1 GiB (384-token canvas)\n" in out.stdout


def test_info_names_the_llada2_2_variant_and_the_profile_it_picks(tmp_path):
    from fastdllm.testing.tiny_moe import write_llada2_2

    both = write_llada2_2(tmp_path / "indel", delete_token_id=5, split_token_id=6)
    out = CliRunner().invoke(app, ["info", str(both)])
    lines = {line.split("  ")[0]: line.split("  ", 1)[1].strip() for line in out.stdout.splitlines()}
    assert lines["variant"] == ("LLaDA2.2: block routing (4 of 8 experts per block of 32), insert/delete editing "
                                "(DELETE id 5, SPLIT id 6)")
    assert lines["profile"] == "llada2.2 (when -P is not given)"
    routing = json.loads(CliRunner().invoke(app, ["info", str(write_llada2_2(tmp_path / "br")), "--json"]).stdout)
    assert routing["variant"] == "LLaDA2.2: block routing (4 of 8 experts per block of 32)"
    assert routing["profile"] == "llada2"
    builtin = CliRunner().invoke(app, ["info"])
    assert "variant" not in builtin.stdout and "default (when -P is not given)" in builtin.stdout


def test_ps_without_a_server_is_one_line():
    import socket

    with socket.socket() as s:                          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = CliRunner().invoke(app, ["ps", "--port", str(port)])
    assert out.exit_code == 1 and out.output.count("\n") == 1
    assert out.output.startswith(f"error: no fastdllm serve at http://127.0.0.1:{port}/api/ps")
