"""`fastdllm pull NAME|HUB_ID`: a checkpoint into the Hugging Face cache with huggingface_hub's own
downloader (its progress bars with bytes and rate; a transfer cut off resumes where it stopped,
with a Range request), only weights, configs and tokenizer files (never a checkpoint's Python),
each file checked against the size and the LFS sha256 the hub lists. Every failure is one line
and leaves no half-written file; when a pull stops (the network, Ctrl+C) the files it completed
stay and the next pull fetches only the rest."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from ..errors import UsageError, UserError
from . import catalog
from .locate import ALLOW_PATTERNS, hub_settings


@dataclass(frozen=True)
class Pulled:
    name: str             # the short name, else the hub id
    repo_id: str
    path: Path            # the snapshot a command loads
    files: list[str]
    bytes: int
    skipped_code: list[str]   # the repo's .py files, never fetched


def target(spec: str) -> tuple[str, str, str | None]:
    """(name to show, hub id, revision) of a short name or a hub id."""
    entry = catalog.lookup(spec)
    if entry is not None:
        return entry.name, entry.hub, entry.revision
    if catalog.is_short_name(spec):
        catalog.find(spec)                                   # raises: an unknown name, with the close ones
    if spec.count("/") != 1 or spec.startswith(("/", ".")):
        raise UsageError(f"'{spec}' is neither a catalog name (fastdllm recommend) nor a hub id (ORG/NAME)")
    return spec, spec, None


def wanted(path: str) -> bool:
    return any(fnmatch(path, p) for p in ALLOW_PATTERNS)


def pull(spec: str, *, progress: bool = True) -> Pulled:
    name, repo_id, revision = target(spec)
    settings = hub_settings()
    endpoint = settings.get("endpoint") or _default_endpoint()
    listing = _listing(repo_id, revision, endpoint)
    files = {f.path: f for f in listing if wanted(f.path)}
    if "config.json" not in files:
        raise UserError(f"{repo_id} has no config.json: not a checkpoint fastdllm can run")
    repo_folder = _repo_folder(repo_id, settings)
    existed = repo_folder.exists()
    # a stopped pull keeps the files it completed (each whole: huggingface_hub writes a temporary
    # file and renames it), so the next pull fetches only the rest; until then the snapshot is
    # neither listed nor loaded (locate.is_complete)
    path = _download(repo_id, revision, settings, progress)
    try:
        _verify(path, files)
    except UserError:
        if not existed:                     # a first pull that failed its check leaves nothing behind
            shutil.rmtree(repo_folder, ignore_errors=True)
        raise
    return Pulled(name=name, repo_id=repo_id, path=path, files=sorted(files),
                  bytes=sum(f.size for f in files.values()),
                  skipped_code=sorted(f.path for f in listing if f.path.endswith(".py")))


def _default_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _listing(repo_id: str, revision: str | None, endpoint: str):
    """The repo's files at the revision (size, LFS sha256); one line for each way this fails."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint)
    try:
        commit = api.repo_info(repo_id, revision=revision).sha
        return [f for f in api.list_repo_tree(repo_id, recursive=True, revision=commit) if isinstance(f, RepoFile)]
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


def _download(repo_id: str, revision: str | None, settings: dict, progress: bool) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    (enable_progress_bars if progress else disable_progress_bars)()
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS, **settings))
    except KeyboardInterrupt:
        raise
    except Exception as e:
        raise UserError(f"download of {repo_id} failed ({type(e).__name__}: {one_line(e)}); the files "
                        "already complete are kept: run the same pull again to fetch the rest") from None


def one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:160] if text else ""


def _verify(path: Path, files: dict) -> None:
    """Every fetched file has the size the hub lists, and each LFS file its sha256; a bad one is
    removed (its blob too), so that the next pull fetches it again."""
    for name, f in files.items():
        local = path / name
        if not local.is_file():
            raise UserError(f"{name} is missing after the download; run the same pull again")
        expected = f.lfs.sha256 if f.lfs is not None else None
        size_ok = local.stat().st_size == f.size
        if not size_ok or (expected and _sha256(local) != expected):
            blob = local.resolve()
            local.unlink()
            blob.unlink(missing_ok=True)
            what = "sha256" if size_ok else "size"
            raise UserError(f"{name} does not match the {what} the hub lists (removed); run the same pull "
                            "again, and if it fails again the download is being altered on the way")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _repo_folder(repo_id: str, settings: dict) -> Path:
    from huggingface_hub import constants

    cache = Path(settings.get("cache_dir") or constants.HF_HUB_CACHE)
    return cache / f"models--{repo_id.replace('/', '--')}"
