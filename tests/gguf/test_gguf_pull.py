"""`pull`, `list`, `show`, `rm` of GGUF files against the stand-in hub (tests/hub_server.py, through
HF_ENDPOINT; huggingface_hub's real download code runs): a pull with a quant tag fetches that one
file, checked by its sha256, and every -m then finds it without the network; `list` and `show` name
it NAME:TAG with its real size; `rm` removes that file only. A tag the repo lacks, no tag among
several files, and a split file are one line each, before any transfer. A repo's quant sizes in
the catalog: `show` and `recommend` (its fit verdict uses the quant's size)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import invoke
from helpers import one_error_line, use_hub
from fastdllm.checkpoints import catalog, fit
from fastdllm.checkpoints.locate import resolve_model_dir
from fastdllm.units import human_bytes
from hub_server import Hub

gguf = pytest.importorskip("gguf")

from gguf_writer import write_gguf  # noqa: E402  (after the skip)

pytestmark = pytest.mark.fast

REPO, SPLIT = "tiny-org/Tiny-LLaDA-GGUF", "tiny-org/Split-GGUF"
F32, Q8 = "tiny-llada.F32.gguf", "tiny-llada.Q8_0.gguf"
GIB = 2**30


@pytest.fixture(scope="module")
def files(llada_dir, tmp_path_factory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("gguf-files")
    return {F32: write_gguf(llada_dir, root / F32, "F32").read_bytes(),
            Q8: write_gguf(llada_dir, root / Q8, "Q8_0").read_bytes()}


@pytest.fixture
def hub(files, tmp_path, monkeypatch):
    parts = {f"Q8_0/tiny-Q8_0-0000{i}-of-00002.gguf": files[Q8][:500] for i in (1, 2)}
    server = Hub(repos={REPO: {**files, "README.md": b"# tiny\n"}, SPLIT: parts}).start()
    use_hub(monkeypatch, server.url, tmp_path / "cache")
    yield server
    server.stop()


def test_pull_with_a_tag_fetches_that_one_file_and_every_m_finds_it_offline(hub, files):
    out = invoke("pull", f"{REPO}:Q8_0")
    assert out.exit_code == 0, out.output
    path = Path(out.stdout.strip().splitlines()[-1])
    assert path.name == Q8 and path.read_bytes() == files[Q8]
    assert hub.fetched() == [Q8]                                  # not the F32 file, not the README
    assert f"pulled {REPO}:Q8_0: 1 file, {human_bytes(len(files[Q8]))}, each checked against the hash" in out.output
    hub.requests.clear()
    for spec in (f"{REPO}:Q8_0", f"{REPO}:q8_0", REPO):           # the one GGUF file here needs no tag
        assert resolve_model_dir(spec).name == Q8
    assert hub.requests == []


def test_list_show_and_rm_name_the_file_with_its_tag_and_real_size(hub, files, tmp_path):
    assert invoke("pull", f"{REPO}:Q8_0", "-q").exit_code == 0
    assert invoke("pull", f"{REPO}:F32", "-q").exit_code == 0
    listed = {m["name"]: m for m in json.loads(invoke("list", "--json").stdout)["models"]}
    for tag, name in (("Q8_0", Q8), ("F32", F32)):
        model = listed[f"{REPO}:{tag}"]
        assert (model["family"], model["quantization"], model["where"]) == ("llada", f"GGUF {tag}", "hf-cache")
        assert model["size_bytes"] == len(files[name]) and model["path"].endswith(name)
    row = next(line for line in invoke("list").stdout.splitlines() if line.startswith(f"{REPO}:Q8_0"))
    assert "GGUF Q8_0" in row and human_bytes(len(files[Q8])) in row
    shown = invoke("show", f"{REPO}:q8_0")
    assert shown.exit_code == 0 and Q8 in shown.stdout and f"{human_bytes(len(files[Q8]))}, GGUF Q8_0" in shown.stdout
    assert "is here as 2 GGUF files: name one" in one_error_line(invoke("rm", REPO, "-y"))
    removed = invoke("rm", f"{REPO}:Q8_0", "-y")
    assert removed.exit_code == 0 and f"removed {REPO}:Q8_0" in removed.output
    names = {m["name"] for m in json.loads(invoke("list", "--json").stdout)["models"]}
    assert f"{REPO}:Q8_0" not in names and f"{REPO}:F32" in names           # the other tag stays


def test_an_uncached_tag_in_m_is_pulled_then_read(hub, files):
    r = invoke("info", "-m", f"{REPO}:F32", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["path"].endswith(f"/{F32}") and hub.fetched() == [F32]


def test_no_tag_among_several_files_is_one_line_naming_the_tags(hub, tmp_path):
    assert f"error: {REPO} holds 2 GGUF files: name one with a tag, {REPO}:Q8_0 (its tags: Q8_0, F32)" in \
        one_error_line(invoke("pull", REPO))
    assert f"{REPO} has no GGUF file tagged Q4_K_M (its tags: Q8_0, F32)" in one_error_line(invoke("pull", f"{REPO}:Q4_K_M"))
    assert hub.fetched() == [] and not (tmp_path / "cache").exists()


def test_a_split_file_is_refused_by_name_before_any_transfer(hub):
    line = one_error_line(invoke("pull", f"{SPLIT}:Q8_0"))
    assert f"{SPLIT}:Q8_0 is a GGUF file split in 2 parts (tiny-Q8_0-00001-of-00002.gguf, ...)" in line
    assert "llama-gguf-split --merge" in line and hub.fetched() == []


def test_a_tag_on_a_safetensors_entry_is_a_usage_error():
    out = invoke("pull", "dream:7b:Q4_K_M")
    assert out.exit_code == 2 and "dream:7b is a safetensors checkpoint; a quant tag names a file" in out.output


# --- the catalog's GGUF entries: quant tags and sizes in `show`, the fit verdict in `recommend` ---

GGUF_ENTRIES = {n: e for n, e in catalog.entries().items() if e.gguf}


def test_each_gguf_architecture_fastdllm_reads_has_an_entry_with_its_sizes():
    from fastdllm.checkpoints.gguf_arch import ARCHS

    assert {e.family for e in GGUF_ENTRIES.values()} == {"llada", "Dream", "rnd1"} and set(ARCHS) == {
        "llada", "dream", "rnd1", "llada-moe"}
    assert any(e.shape == "llada-moe:7b-a1b-instruct" for e in GGUF_ENTRIES.values())   # architecture llada-moe
    for entry in GGUF_ENTRIES.values():
        assert entry.note and entry.shape and entry.hub.lower().endswith("-gguf")
        for tag, fields in entry.gguf.items():
            assert fields["source"] in ("read", "computed") and fields["bytes"] > 10**9 and fields["cpu_gib"] > 1
            assert fields["source"] == "read" or "computed, not read" in entry.note


def test_show_lists_the_tags_with_their_file_sizes(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    out = invoke("show", "llada:8b-instruct-gguf")
    assert out.exit_code == 0, out.output
    assert "gguf Q4_K_M  4,920,049,664 bytes (4.6 GB, computed, LLaDA-8B-Instruct.Q4_K_M.gguf); 6.2 GiB held on a CPU" in out.stdout
    assert "not here: fastdllm pull llada:8b-instruct-gguf:Q4_K_M" in out.stdout
    card = json.loads(invoke("show", "rnd1:30b-a3b-gguf", "--json").stdout)
    assert card["gguf"]["Q8_0"] == {"file": "rnd1-base-0910-q8_0.gguf", "bytes": 32483927584, "source": "read", "cpu_gib": 28.8}


def machine(monkeypatch, kind: str, gib: float):
    monkeypatch.setattr(fit, "this_machine", lambda device="auto": fit.Machine(kind, "here", int(gib * GIB)))


def recommended(*args) -> dict[str, dict]:
    out = invoke("recommend", "--json", *args)
    assert out.exit_code == 0, out.output
    return {m["name"]: m for m in json.loads(out.stdout)["models"]}


def test_recommend_sizes_a_gguf_entry_by_its_quants(monkeypatch):
    machine(monkeypatch, "cpu", 9)             # 8 GiB for the model: Q8_0 (8.1 GiB held) does not fit, Q4_K_M does
    found = recommended()
    assert found["llada:8b-instruct-gguf"]["form"] == "Q4_K_M"
    assert found["llada:8b-instruct-gguf"]["flags"] == "-m llada:8b-instruct-gguf:Q4_K_M"
    assert found["llada:8b-instruct-gguf"]["memory_gib"] == 6.2
    machine(monkeypatch, "cpu", 10)
    assert recommended()["llada:8b-instruct-gguf"]["flags"] == "-m llada:8b-instruct-gguf:Q8_0 --quantize int8"
    machine(monkeypatch, "cpu", 6)             # 5 GiB: even Q4_K_M's 6.2 GiB does not, though its file is 4.6 GiB
    everything = recommended("--all")
    assert everything["llada:8b-instruct-gguf"]["fits"] is False and everything["llada:8b-instruct-gguf"]["form"] == "Q4_K_M"
    machine(monkeypatch, "gpu", 12)            # a GPU dequantizes the file: the largest tag, 8-bit by bitsandbytes
    assert recommended()["dream:7b-gguf"]["flags"] == "-m dream:7b-gguf:Q8_0 --quantize 8bit"


def test_a_quant_larger_held_than_its_file_is_sized_by_the_file_where_that_is_more():
    entry = GGUF_ENTRIES["rnd1:30b-a3b-gguf"]
    (tag, flags, gib), = entry.gguf_forms("cpu")
    assert tag == "Q8_0" and gib == round(max(32483927584 / GIB + entry.cache_gib(), 28.8), 1) == 30.3


@pytest.mark.slow
@pytest.mark.parametrize("name", GGUF_ENTRIES)
def test_computed_sizes_are_the_scripts(name):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import gguf_sizes

    entry = GGUF_ENTRIES[name]
    for tag, fields in entry.gguf.items():
        file, held = gguf_sizes.sizes(entry.shape, tag)
        assert fields["cpu_gib"] == round(held / GIB, 1)
        if fields["source"] == "computed":
            assert fields["bytes"] == file
        else:                                    # read: the computed tensor data is within the header's few MB
            assert 0 < fields["bytes"] - file < 16 * 2**20
