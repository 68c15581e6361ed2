"""A catalog name runs end to end: the published files of sdar:8b-chat (../shared/fixtures/published)
laid over tiny random weights of their family, found in a Hugging Face cache by `-m sdar:8b-chat`,
loaded with the entry's profile (SDAR's blocks of 4, not the generic default's 32), past the fit
verdict, and decoded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fastdllm.cli.app import app
from fastdllm.checkpoints import catalog
from fastdllm.testing.tiny_blockdiff import write_sdar

SHARED = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "published"
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 128, "max_window_layers": 2}


def as_published(entry: catalog.Entry, out: Path) -> Path:
    """Tiny weights of the entry's family under the entry's real files (config sizes shrunk)."""
    src = SHARED / entry.hub.replace("/", "__")
    if not src.is_dir():
        pytest.skip(f"no published files of {entry.hub} in this checkout")
    write_sdar(out, block_size=None, mask_in_config=False, **{k: TINY[k] for k in ("hidden_size", "head_dim",
                                                                                    "intermediate_size")},
               n_layers=TINY["num_hidden_layers"], n_heads=TINY["num_attention_heads"], n_kv_heads=TINY["num_key_value_heads"])
    for f in src.iterdir():
        if f.name != "model.safetensors.index.json":        # the tiny shards have their own index
            shutil.copyfile(f, out / f.name)
    config = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **TINY}, indent=2))
    return out


def test_a_short_name_runs_with_its_entrys_profile(tmp_path, monkeypatch):
    entry = catalog.find("sdar:8b-chat")
    repo = tmp_path / "cache" / f"models--{entry.hub.replace('/', '--')}"
    commit = "b" * 40
    as_published(entry, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = CliRunner().invoke(app, ["generate", "-m", "sdar:8b-chat", "hello", "-n", "8", "--json", "--dtype", "fp32"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert result["profile"] == entry.profile == "sdar"
    assert result["config"]["block_len"] == 4 and result["nfe"] > 0
