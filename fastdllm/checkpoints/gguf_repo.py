"""`-m` naming a folder or a hub repository of GGUF files, with a quant tag or without:
`./folder:Q8_0`, `./folder` (one GGUF file), `org/LLaDA-8B-Instruct-GGUF:Q4_K_M`, and a catalog GGUF
entry `llada:8b-instruct-gguf:Q4_K_M`. The file is found in the folder, else in the Hugging Face
cache (a `pull` put it there), else pulled (its one file, checked: pull.py); then it is read as
any GGUF file is (gguf_folder.py). Tags and the refusals: gguf_tags.py."""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from . import catalog
from .gguf_tags import Choice, choices, looks_like_tag, pick


def resolve(spec: str) -> Path | None:
    """The folder standing for the GGUF file `spec` means, or None when `spec` is not a GGUF
    folder or repository name (locate.py goes on with it)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file() or not local_choices(path):
            return None                                   # a checkpoint folder (or nothing of ours)
        return _folder(path / pick(local_choices(path), None, spec).files[0])
    base, _, tag = spec.rpartition(":")
    if base and Path(base).expanduser().is_dir():          # ./folder:Q8_0 (any tag: the folder is here)
        folder = Path(base).expanduser()
        return _folder(folder / pick(local_choices(folder), tag, base).files[0])
    if not (base and looks_like_tag(tag)):
        base, tag = spec, None
    repo = hub_repo(base, tagged=tag is not None)
    if repo is None:
        return None
    if (cached := cached_file(repo, tag, where=base)) is not None:
        return _folder(cached)
    from .pull import pull                                 # not here yet: its one file, checked

    return _folder(pull(spec).path)


def hub_repo(name: str, tagged: bool) -> str | None:
    """The hub repository of GGUF files a name means: a catalog GGUF entry's, an `org/NAME` with a
    tag, or one named `*-GGUF` or held as GGUF files in the cache; else None."""
    entry = catalog.lookup(name)
    if entry is not None:
        return entry.hub if entry.gguf else None
    if name.count("/") != 1 or name.startswith(("/", ".", "~")):
        return None
    if tagged or name.lower().endswith("-gguf") or cached_choices(name):
        return name
    return None


def local_choices(folder: Path) -> list[Choice]:
    """The GGUF files of a folder and of its subfolders one level down (split files often sit in
    a folder named after their tag)."""
    found = [*folder.glob("*.gguf"), *folder.glob("*/*.gguf")]
    return choices((p.relative_to(folder).as_posix(), p.stat().st_size) for p in found if p.is_file())


def repo_folder(repo_id: str) -> Path:
    from huggingface_hub import constants

    from .hub import hub_settings

    cache = Path(hub_settings().get("cache_dir") or constants.HF_HUB_CACHE)
    return cache / f"models--{repo_id.replace('/', '--')}"


def snapshots(repo_id: str) -> list[Path]:
    """The cache's snapshots of a repo, the one refs/main names first, then the newest."""
    try:
        folder = repo_folder(repo_id)
    except ImportError:                                   # no huggingface_hub: no cache either
        return []
    found = sorted((folder / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime, reverse=True)
    main = folder / "refs" / "main"
    head = main.read_text().strip() if main.is_file() else None
    return sorted(found, key=lambda p: p.name != head)


def cached_choices(repo_id: str) -> list[tuple[Choice, Path]]:
    """(choice, snapshot) for each GGUF file a pull left in the cache (a path seen twice: the first
    snapshot's). A file is linked into a snapshot only once its transfer is whole."""
    seen: dict[str, tuple[Choice, Path]] = {}
    for snapshot in snapshots(repo_id):
        files = [p for p in snapshot.rglob("*.gguf") if p.is_file()]
        for choice in choices((p.relative_to(snapshot).as_posix(), p.stat().st_size) for p in files):
            seen.setdefault(choice.files[0], (choice, snapshot))
    return list(seen.values())


def cached_file(repo_id: str, tag: str | None, where: str) -> Path | None:
    """The cached file `where:tag` means, or None when the cache has none of that tag (no tag:
    when it holds exactly one GGUF file of the repo; several name their tags)."""
    cached = cached_choices(repo_id)
    if not cached:
        return None
    if tag is None and len(cached) == 1:
        choice, snapshot = cached[0]
    else:
        try:
            choice = pick([c for c, _ in cached], tag, where)
        except UserError:
            if tag is None:
                raise                                    # several here and no tag: name them
            return None                                  # not this tag here: the hub may have it
        snapshot = next(s for c, s in cached if c == choice)
    return snapshot / choice.files[0]


def _folder(file: Path) -> Path:
    from .gguf_folder import folder_for

    return folder_for(file)
