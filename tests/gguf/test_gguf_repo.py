"""A folder or a hub repository of GGUF files named with a quant tag (checkpoints/gguf_tags.py,
gguf_repo.py): `-m DIR:TAG`, `-m DIR` (one file), `-m ORG/X-GGUF:TAG` and a catalog GGUF entry
`-m NAME:TAG` in every command that takes -m; the refusals (no such tag, several files, a split
file) in one line naming the tags. Which file a command took is told by an MXFP4 file beside the F32
one: fastdllm refuses MXFP4 by name before reading a weight, so a command that took it says its name.
Pull, list, show and rm against the stand-in hub: tests/gguf/test_gguf_pull.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import invoke
from fastdllm.checkpoints.locate import resolve_model_dir
from one_line import one_line_refusal

gguf = pytest.importorskip("gguf")

from gguf_writer import write_gguf  # noqa: E402  (after the skip)

pytestmark = pytest.mark.fast

HUB = "tiny-org/Tiny-LLaDA-GGUF"
CATALOG = "llada:8b-instruct-gguf"                  # its hub, mradermacher/LLaDA-8B-Instruct-GGUF, stood in for
CATALOG_HUB = "mradermacher/LLaDA-8B-Instruct-GGUF"
F32, MX = "tiny-llada.F32.gguf", "tiny-llada.MXFP4.gguf"
EVAL = ["--tasks", "tiny_next_line", "--include-path", str(Path(__file__).resolve().parents[1] / "eval_task"), "--limit", "1"]
COMMANDS = {                                        # each command that takes -m, at its smallest
    "generate": ["generate", "-n", "8", "--block-len", "8", "hi"],
    "chat": ["chat", "-n", "8", "--block-len", "8"],
    "serve": ["serve", "--port", "0"],
    "bench": ["bench", "-n", "8", "--block-len", "8", "-c", "baseline", "--n-prompts", "1", "-r", "1", "--warmup", "0"],
    "eval": ["eval", *EVAL],
    "info": ["info"],
}


@pytest.fixture(scope="module")
def files(llada_dir, tmp_path_factory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("gguf-files")
    return {F32: write_gguf(llada_dir, root / F32, "F32").read_bytes(),
            MX: write_gguf(llada_dir, root / MX, "MXFP4").read_bytes()}


def in_cache(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """A snapshot of repo_id in a Hugging Face cache, as a pull leaves it (blobs, links, refs/main)."""
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "b" * 40
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    for name, data in files.items():
        blob = folder / "blobs" / f"{abs(hash((repo_id, name))):x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = folder / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(blob)
    return folder / "snapshots" / commit


@pytest.fixture
def places(files, tmp_path, monkeypatch) -> dict[str, dict[str, str]]:
    """Each way to name the MXFP4 file and the F32 one (by tag), offline."""
    both = tmp_path / "tiny-GGUF"
    both.mkdir()
    for name, data in files.items():
        (both / name).write_bytes(data)
        (tmp_path / f"only-{name}").mkdir()
        (tmp_path / f"only-{name}" / name).write_bytes(data)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    in_cache(tmp_path / "cache", HUB, files)
    in_cache(tmp_path / "cache", CATALOG_HUB, {"LLaDA-8B-Instruct.MXFP4.gguf": files[MX], "LLaDA-8B-Instruct.F32.gguf": files[F32]})
    return {tag: {"folder:tag": f"{both}:{tag}", "folder": str(tmp_path / f"only-{name}"), "hub:tag": f"{HUB}:{tag.lower()}",
                  "catalog:tag": f"{CATALOG}:{tag}"} for tag, name in (("MXFP4", MX), ("F32", F32))}


FORMS = ["folder:tag", "folder", "hub:tag", "catalog:tag"]


@pytest.mark.parametrize("form", FORMS)
def test_each_form_names_its_file(places, form):
    folder = resolve_model_dir(places["F32"][form])
    assert folder.name.endswith(".F32.gguf") and json.loads((folder / "gguf.json").read_text())["architecture"] == "llada"


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_every_form(places, command, form):
    r = invoke(*COMMANDS[command], "-m", places["MXFP4"][form], input="/bye\n")
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output, r.output
    assert ".MXFP4.gguf holds MXFP4 tensors" in lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_runs_a_tagged_file(places, command, monkeypatch):
    from fastdllm.serve import shutdown

    served = {}
    monkeypatch.setattr(shutdown.GracefulServer, "run", lambda self, sockets=None: served.update(app=self.config.app))
    r = invoke(*COMMANDS[command], "-m", places["F32"]["folder:tag"], input="hello\n/bye\n")
    assert r.exit_code == 0, r.output
    if command == "serve":
        assert served and f"(model {F32}," in r.stderr
    if command == "info":
        assert f"tiny-GGUF/{F32}" in r.stdout


def test_hub_and_catalog_names_generate_as_the_file_does(places, files):
    args = ["generate", "-n", "8", "--block-len", "8", "--dtype", "fp32", "--json", "Hello"]
    want = json.loads(invoke(*args[:1], "-m", places["F32"]["folder"], *args[1:]).stdout)
    for spec in (f"{HUB}:F32", f"{CATALOG}:f32", f"{CATALOG_HUB}:F32"):
        got = invoke(*args[:1], "-m", spec, *args[1:])
        assert got.exit_code == 0, got.output
        assert (json.loads(got.stdout)["ids"], json.loads(got.stdout)["nfe"]) == (want["ids"], want["nfe"])


# --- the refusals: one line, naming the tags there are ---

def test_no_tag_with_several_files_names_the_tags(places):
    both = places["F32"]["folder:tag"].rsplit(":", 1)[0]
    one_line_refusal(lambda: resolve_model_dir(both), f"{both} holds 2 GGUF files: name one with a tag, {both}:MXFP4 "
                                                      "(its tags: MXFP4, F32)")
    one_line_refusal(lambda: resolve_model_dir(HUB), f"{HUB} holds 2 GGUF files: name one with a tag")


def test_a_tag_that_matches_no_file_names_the_tags(places):
    both = places["F32"]["folder:tag"].rsplit(":", 1)[0]
    one_line_refusal(lambda: resolve_model_dir(f"{both}:Q4_K_M"), f"{both} has no GGUF file tagged Q4_K_M "
                                                                  "(its tags: MXFP4, F32)")
    r = invoke("info", "-m", f"{both}:Q4_K_M")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "its tags: MXFP4, F32" in r.stderr


def test_a_tag_that_matches_several_files_names_them(files, tmp_path):
    for name in ("tiny-a.F32.gguf", "tiny-b.F32.gguf"):
        (tmp_path / name).write_bytes(files[F32])
    one_line_refusal(lambda: resolve_model_dir(f"{tmp_path}:F32"),
                     "tag F32 matches 2 files (tiny-a.F32.gguf, tiny-b.F32.gguf); pass one file with -m PATH")


def test_a_split_file_is_refused_by_name(files, tmp_path):
    folder = tmp_path / "split"
    (folder / "Q8_0").mkdir(parents=True)
    for part in (1, 2):                              # unsloth's layout: the parts in a folder named after the tag
        (folder / "Q8_0" / f"tiny-Q8_0-0000{part}-of-00002.gguf").write_bytes(files[F32][:1000])
    (folder / F32).write_bytes(files[F32])
    one_line_refusal(lambda: resolve_model_dir(f"{folder}:Q8_0"),
                     f"{folder}:Q8_0 is a GGUF file split in 2 parts (tiny-Q8_0-00001-of-00002.gguf, ...); fastdllm reads "
                     "whole files so far: join them with llama.cpp's `llama-gguf-split --merge")
    assert resolve_model_dir(f"{folder}:F32").name == F32          # the whole file beside it is taken


def test_a_checkpoint_folder_and_catalog_names_are_not_taken_for_tags(places, llada_dir):
    assert resolve_model_dir(str(llada_dir)) == llada_dir            # config.json: a checkpoint, as before
    from fastdllm.errors import UsageError

    with pytest.raises(UsageError, match="unknown model 'dream:9b'"):
        resolve_model_dir("dream:9b")
