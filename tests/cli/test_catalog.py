"""The catalog (fastdllm/checkpoints/catalog.yaml): every entry names a family fastdllm has and a
profile that loads; where the checkpoint's published files are here, they are that family, load
with the entry's profile without breaking the block size the model was trained with, and give the
entry's sizes (`fastdllm info`'s estimate, recomputed); short names work in -m and in `info`."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fastdllm.checkpoints import catalog
from fastdllm.checkpoints.family import family_of
from fastdllm.checkpoints.locate import resolve_model_dir
from fastdllm.decode import profiles
from fastdllm.decode.family_defaults import default_profile
from fastdllm.errors import UsageError
from fastdllm.models import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "fixtures" / "published"       # the real files, where this checkout has them
PUBLISHED_CONFIGS = ROOT / "tests" / "published_configs"          # byte copies of their config.json
sys.path.insert(0, str(ROOT / "scripts"))
import catalog_sizes  # noqa: E402

ENTRIES = catalog.entries()
# the profile an entry may name instead of its family's default: its authors' settings differ
# from the family's (TraDo's sampling, LLaDA2.1's editing, the coder models' lower threshold)
OWN_PROFILES = {"trado", "llada2-quality", "code"}


def fixture_name(entry: catalog.Entry) -> str:
    return entry.hub.replace("/", "__")


WITH_CONFIG = [n for n, e in ENTRIES.items() if (PUBLISHED_CONFIGS / f"{fixture_name(e)}.json").is_file()]


def test_the_catalog_covers_every_family_and_the_names_the_issue_asks_for():
    assert {"llada:8b-instruct", "dream:7b", "sdar:8b-chat", "llada2.1:mini", "diffusion-gemma:26b-a4b"} <= set(ENTRIES)
    assert {e.family for e in ENTRIES.values()} == set(FAMILIES) - {"bailing_moe_v2"}  # LLaDA2's other model_type
    hubs = [e.hub.lower() for e in ENTRIES.values()]
    assert len(hubs) == len(set(hubs))
    assert all(catalog.is_short_name(n) and n == n.lower() for n in ENTRIES)
    assert len(WITH_CONFIG) >= 12           # every published config this checkout holds has its entry


@pytest.mark.parametrize("name", ENTRIES)
def test_every_entry_has_its_family_and_a_profile_that_loads(name):
    entry = ENTRIES[name]
    assert entry.family in FAMILIES
    profile = profiles.find(entry.profile)
    assert profiles.resolve(profile, {}) is not None
    assert entry.license and entry.hub.count("/") == 1
    if entry.shape is not None:             # sizes for each precision, as the estimate gives them
        assert entry.parameters >= entry.active_parameters > 0 and entry.context >= 4096
        assert entry.memory_gib("bf16") > entry.memory_gib("8bit") > entry.memory_gib("4bit") > 0


@pytest.mark.parametrize("name", WITH_CONFIG)
def test_published_files_are_the_entrys_family_and_load_with_its_profile(name, tmp_path):
    entry = ENTRIES[name]
    folder = SHARED / fixture_name(entry)
    if folder.is_dir():                                      # all the published files, as a download has them
        shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    else:                                                    # the config alone
        shutil.copy(PUBLISHED_CONFIGS / f"{fixture_name(entry)}.json", tmp_path / "config.json")
    raw = json.loads((tmp_path / "config.json").read_text())
    config, _, notes = family_of(raw, tmp_path)
    assert raw["model_type"] == entry.family and notes == []
    assert entry.context == config.max_position_embeddings
    assert entry.profile == default_profile(raw) or entry.profile in OWN_PROFILES
    cfg = profiles.resolve(profiles.find(entry.profile), {}, tmp_path)
    trained = profiles.model_defaults(tmp_path).get("block_len")
    if trained is not None:                                  # block-causal: the block it was trained with
        assert cfg.block_len == trained


@pytest.mark.parametrize("name", ["llada:8b-instruct", "dream:7b", "sdar:1.7b-chat", "fast-dllm-v2:1.5b"])
def test_sizes_are_infos_estimate(name):
    entry = ENTRIES[name]
    assert catalog_sizes.sizes_of(catalog_sizes.published_config(entry.shape)) == entry.sizes


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, e in ENTRIES.items() if e.shape])
def test_sizes_are_infos_estimate_for_every_entry(name):
    entry = ENTRIES[name]
    assert catalog_sizes.sizes_of(catalog_sizes.published_config(entry.shape)) == entry.sizes


def test_entries_without_a_config_say_their_sizes_are_unknown():
    unknown = [e for e in ENTRIES.values() if e.shape is None]
    assert unknown and all(e.sizes == {} and e.size_label() == "unknown" for e in unknown)


def test_lookup_takes_short_names_and_hub_ids_in_any_case():
    assert catalog.lookup("DREAM:7B").hub == "Dream-org/Dream-v0-Instruct-7B"
    assert catalog.lookup("dream-org/dream-v0-instruct-7b").name == "dream:7b"
    assert catalog.lookup("nothing:here") is None
    with pytest.raises(UsageError, match=r"^unknown model 'dream:9b': try dream:7b, dream:7b-base"):
        catalog.find("dream:9b")


def fake_cache(cache: Path, repo_id: str, files: dict[str, str]) -> Path:
    """A Hugging Face cache holding one snapshot of repo_id (its layout: refs, snapshots)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "a" * 40
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


def test_a_short_name_in_model_resolves_to_the_cached_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = fake_cache(tmp_path, "JetLM/SDAR-1.7B-Chat",
                          {"config.json": (PUBLISHED_CONFIGS / "JetLM__SDAR-1.7B-Chat.json").read_text(),
                           "model.safetensors": "", "tokenizer.json": "{}"})
    assert resolve_model_dir("sdar:1.7b-chat") == snapshot
    assert resolve_model_dir("JetLM/SDAR-1.7B-Chat") == snapshot
    with pytest.raises(UsageError, match="unknown model 'sdar:2b'"):
        resolve_model_dir("sdar:2b")


def test_info_takes_dash_m_and_a_short_name(tmp_path, monkeypatch):
    from fastdllm.cli.app import app

    out = CliRunner().invoke(app, ["info", "-m", "nothing:here"])
    assert out.exit_code == 2 and out.output.count("\n") == 1 and "unknown model 'nothing:here'" in out.output
    builtin = CliRunner().invoke(app, ["info", "-m", str(resolve_model_dir(None)), "--json"])
    assert builtin.exit_code == 0 and json.loads(builtin.stdout)["family"] == "llada"
