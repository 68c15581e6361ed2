"""The repository the `pull` tests fetch from the stand-in hub (tests/hub_server.py), shared by
tests/cli/test_pull.py and test_pull_interrupted.py: its name (REPO, the catalog's sdar:1.7b-chat) and its
files (the tiny_files fixture: a tiny LLaDA checkpoint plus the authors' code, never fetched, and a README),
imported by both test files as a fixture."""

from __future__ import annotations

import pytest

from fastdllm.testing.tiny_random import write_llada

REPO = "JetLM/SDAR-1.7B-Chat"          # catalog entry sdar:1.7b-chat (the tiny files stand in for it)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, bytes]:
    folder = write_llada(tmp_path_factory.mktemp("tiny") / "ckpt", d_model=32, n_layers=1, n_heads=2, mlp_hidden_size=64)
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    # what a hub repo also holds: the authors' code (never fetched) and a README (not a weight file)
    files["modeling_llada.py"] = b"raise SystemExit('a checkpoint\\'s code must never run')\n"
    files["configuration_llada.py"] = b"import os\n"
    files["README.md"] = b"# tiny\n"
    return files
