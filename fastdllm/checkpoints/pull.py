"""`fastdllm pull NAME|HUB_ID`: a checkpoint into the Hugging Face cache with huggingface_hub's own
downloader (a transfer cut off resumes where it stopped, with a Range request), only weights,
configs and tokenizer files (never a checkpoint's Python), each file checked against the size and
the hash the hub lists (fetch.py). From a repository of GGUF files, the one file of a quant tag
(`ORG/X-GGUF:Q4_K_M`; gguf_tags.py). Every failure is one line and leaves no half-written file; when
a pull stops (the network, a file the hub cannot give, Ctrl+C) the files it checked stay and the
next pull fetches only the rest; until a pull ends well the copy is neither listed nor used."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from ..errors import UsageError, UserError
from . import catalog
from .fetch import Fetch, Mismatch, Report
from .gguf_tags import choices, looks_like_tag, pick
from .hub import ALLOW_PATTERNS, hub_settings


@dataclass(frozen=True)
class Pulled:
    name: str             # the short name, else the hub id (with the quant tag of a GGUF file)
    repo_id: str
    path: Path            # the snapshot a command loads (a GGUF file: the file)
    files: list[str]
    bytes: int
    fetched: list[str]        # the files this pull transferred (the others were here, checked)
    skipped_code: list[str]   # the repo's .py files, never fetched


def target(spec: str) -> tuple[str, str, str | None, str | None]:
    """(name to show, hub id, revision, quant tag) of a short name or a hub id, each with or
    without a GGUF quant tag (`llada:8b-instruct-gguf:Q4_K_M`, `ORG/X-GGUF:Q8_0`)."""
    base, _, tag = spec.rpartition(":")
    if not (base and looks_like_tag(tag)):
        base, tag = spec, None
    entry = catalog.lookup(base)
    if entry is not None:
        if tag is not None and not entry.gguf:
            raise UsageError(f"'{spec}': {entry.name} is a safetensors checkpoint; a quant tag names a file of "
                             "a GGUF repository (fastdllm recommend --all lists the *-gguf entries)")
        return entry.name, entry.hub, entry.revision, tag
    if catalog.is_short_name(base):
        catalog.find(base)                                   # raises: an unknown name, with the close ones
    if base.count("/") != 1 or base.startswith(("/", ".")):
        raise UsageError(f"'{spec}' is neither a catalog name (fastdllm recommend) nor a hub id (ORG/NAME)")
    return base, base, None, tag


def wanted(path: str) -> bool:
    return any(fnmatch(path, p) for p in ALLOW_PATTERNS)


def pull(spec: str, *, report: Report | None = None) -> Pulled:
    name, repo_id, revision, tag = target(spec)
    settings = hub_settings()
    endpoint = settings.get("endpoint") or _default_endpoint()
    commit, listing = _listing(repo_id, revision, endpoint)
    files = {f.path: f for f in listing if wanted(f.path)}
    ggufs = {f.path: f for f in listing if f.path.lower().endswith(".gguf")}
    gguf_file = None
    if tag is not None or ("config.json" not in files and ggufs):    # a GGUF repository: the tag's one file
        choice = pick(choices((p, f.size) for p, f in ggufs.items()), tag, name)
        gguf_file, name = choice.files[0], f"{name}:{choice.tag}" if choice.tag else name
        files = {gguf_file: ggufs[gguf_file]}
    elif "config.json" not in files:
        raise UserError(f"{repo_id} has no config.json: not a checkpoint fastdllm can run")
    repo_folder = _repo_folder(repo_id, settings)
    existed = repo_folder.exists()
    fetch = Fetch(repo_id, commit, repo_folder, settings, report)
    try:
        fetch.fetch(files)
    except Mismatch:
        if not existed:                     # a first pull that failed its check leaves nothing behind
            shutil.rmtree(repo_folder, ignore_errors=True)
        raise
    if revision != commit:                  # what `-m NAME` and `list` find without the network
        ref = repo_folder / "refs" / (revision or "main")
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    return Pulled(name=name, repo_id=repo_id, path=fetch.snapshot / gguf_file if gguf_file else fetch.snapshot,
                  files=sorted(files),
                  bytes=sum(f.size for f in files.values()), fetched=fetch.fetched,
                  skipped_code=sorted(f.path for f in listing if f.path.endswith(".py")))


def _default_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _listing(repo_id: str, revision: str | None, endpoint: str):
    """The revision's commit and its files (size, git blob hash, LFS sha256); one line for each way
    this fails."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint)
    try:
        commit = api.repo_info(repo_id, revision=revision).sha
        tree = api.list_repo_tree(repo_id, recursive=True, revision=commit)
        return commit, [f for f in tree if isinstance(f, RepoFile)]
    except RepositoryNotFoundError:
        raise UserError(f"no model '{repo_id}' on the hub ({endpoint}); check the name, "
                        "or log in (`hf auth login`) if it is private or gated") from None
    except RevisionNotFoundError:
        raise UserError(f"{repo_id} has no revision '{revision}' on the hub ({endpoint})") from None
    except HfHubHTTPError as e:
        status = getattr(e.response, "status_code", "?")
        raise UserError(f"the hub ({endpoint}) answered {status} for {repo_id}; try again later") from None
    except Exception as e:     # refused, timed out, no route, offline mode: the hub cannot be reached
        raise UserError(f"cannot reach the hub at {endpoint} ({type(e).__name__}); check the network, "
                        "or download elsewhere and pass the directory with --model DIR") from None


def _repo_folder(repo_id: str, settings: dict) -> Path:
    from huggingface_hub import constants

    cache = Path(settings.get("cache_dir") or constants.HF_HUB_CACHE)
    return cache / f"models--{repo_id.replace('/', '--')}"
