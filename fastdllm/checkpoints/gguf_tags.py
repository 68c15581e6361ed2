"""Quant tags: which GGUF file of a folder or a hub repository `NAME:Q4_K_M` means, the way
llama.cpp (`-hf org/repo:Q4_K_M`) and ollama (`hf.co/org/repo:Q4_K_M`) name them. A file's tag is
read from its name (`LLaDA-8B-Instruct.Q4_K_M.gguf`, `Dream-org_Dream-v0-Instruct-7B-Q8_0.gguf`,
`ggml-model-q4_k_m.gguf`); the parts of a split file (`X-Q8_0-00001-of-00003.gguf`) are one choice.
No torch, no numpy, no network: `list` and `show` use this too."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import PurePosixPath

from ..errors import UserError

# llama.cpp's type and file-type names as they appear in file names: Q4_K_M, Q8_0, IQ4_XS, TQ1_0,
# F16, BF16, F32 (and unsloth's Q4_K_XL); a letter or digit on either side means it is no tag
_TAG = re.compile(r"(?<![A-Za-z0-9])((?:IQ|TQ|Q)\d(?:_[A-Za-z0-9]+)*|MXFP4(?:_MOE)?|BF16|FP16|FP32|F16|F32)(?![A-Za-z0-9])",
                  re.IGNORECASE)
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})$")          # llama.cpp's gguf-split naming, before .gguf


def quant_tag(text: str) -> str | None:
    """The last quant tag in a file name (or a tag as typed: `ud-q4_k_xl` -> Q4_K_XL), upper-cased."""
    stem = PurePosixPath(text).name
    stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
    found = _TAG.findall(_SPLIT.sub("", stem))
    return found[-1].upper() if found else None


def looks_like_tag(text: str) -> bool:
    """Whether the part after a name's last ':' is a quant tag (`Q4_K_M`), not a catalog tag (`7b`)."""
    return "/" not in text and quant_tag(text) is not None


def split_part(path: str) -> tuple[str, int, int] | None:
    """(prefix, part, parts) of `X-00002-of-00003.gguf`, else None."""
    stem = path[:-5] if path.lower().endswith(".gguf") else path
    m = _SPLIT.search(stem)
    return (stem[:m.start()], int(m[1]), int(m[2])) if m else None


@dataclass(frozen=True)
class Choice:
    """One GGUF model in a folder or repository: a file, or the parts of a split file."""

    tag: str | None               # Q4_K_M; None when the name carries none
    files: tuple[str, ...]        # paths inside the folder or repo: one, or every part in order
    size: int                     # bytes of all of them

    @property
    def label(self) -> str:
        return self.tag or PurePosixPath(self.files[0]).name


def choices(items) -> list[Choice]:
    """Every GGUF model among (path, size) pairs, split parts grouped, by size."""
    singles, parts = [], {}
    for path, size in items:
        if not path.lower().endswith(".gguf") or PurePosixPath(path).name.lower().startswith("mmproj"):
            continue                                   # a vision projector is no language model
        if (part := split_part(path)) is not None:
            parts.setdefault(part[0], []).append((part[1], path, size))
        else:
            singles.append(Choice(quant_tag(path), (path,), size))
    for prefix, found in parts.items():
        found.sort()
        singles.append(Choice(quant_tag(prefix), tuple(p for _, p, _ in found), sum(s for _, _, s in found)))
    return sorted(singles, key=lambda c: (c.size, c.files))


def tags_line(found: list[Choice]) -> str:
    return ", ".join(dict.fromkeys(c.label for c in found)) or "none"


def pick(found: list[Choice], tag: str | None, where: str) -> Choice:
    """The choice `where:tag` means (no tag: the only one); one line naming the tags otherwise.
    A split file is refused by name: fastdllm reads whole files."""
    if not found:
        raise UserError(f"{where} holds no GGUF file")
    if tag is None:
        if len(found) > 1:
            raise UserError(f"{where} holds {len(found)} GGUF files: name one with a tag, {where}:{found[0].label} "
                            f"(its tags: {tags_line(found)})")
        chosen = found[0]
    else:
        wanted = (quant_tag(tag) or tag).upper()
        matches = [c for c in found if c.tag == wanted or c.label.upper() == tag.upper()]
        if not matches:
            raise UserError(f"{where} has no GGUF file tagged {tag} (its tags: {tags_line(found)})")
        if len(matches) > 1:
            names = ", ".join(PurePosixPath(c.files[0]).name for c in matches)
            raise UserError(f"{where}: tag {tag} matches {len(matches)} files ({names}); pass one file with -m PATH "
                            f"(its tags: {tags_line(found)})")
        chosen = matches[0]
    if len(chosen.files) > 1:
        first = PurePosixPath(chosen.files[0]).name
        raise UserError(f"{where}:{chosen.label} is a GGUF file split in {len(chosen.files)} parts ({first}, ...); "
                        f"fastdllm reads whole files so far: join them with llama.cpp's "
                        f"`llama-gguf-split --merge {first} OUT.gguf`, then -m OUT.gguf")
    return chosen


# --- general.architecture from the header, without the gguf package (for `list`) ---

_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}    # GGUF value type -> bytes
_STRING, _ARRAY = 8, 9


def architecture(path) -> str | None:
    """`general.architecture` (the converter writes it first), or None for a file that is no GGUF."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)                          # magic, version u32, tensor count u64, key count u64
            if len(head) < 24 or head[:4] != b"GGUF":
                return None
            n_keys = struct.unpack("<Q", head[16:24])[0]
            for _ in range(min(n_keys, 64)):
                key = _string(f)
                kind = struct.unpack("<I", f.read(4))[0]
                if key == "general.architecture" and kind == _STRING:
                    return _string(f)
                _skip(f, kind)
    except (OSError, struct.error, ValueError, UnicodeDecodeError):
        return None
    return None


def _string(f) -> str:
    n = struct.unpack("<Q", f.read(8))[0]
    if n > 1 << 20:
        raise ValueError("not a GGUF string")
    return f.read(n).decode()


def _skip(f, kind: int) -> None:
    if kind == _STRING:
        f.seek(struct.unpack("<Q", f.read(8))[0], 1)
    elif kind == _ARRAY:
        item, count = struct.unpack("<IQ", f.read(12))
        if item in _FIXED:
            f.seek(_FIXED[item] * count, 1)
        else:
            for _ in range(count):
                _skip(f, item)
    elif kind in _FIXED:
        f.seek(_FIXED[kind], 1)
    else:
        raise ValueError(f"GGUF value type {kind}")
