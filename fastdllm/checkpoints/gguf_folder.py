"""A GGUF file seen as a checkpoint directory, so that every command (profiles, the fit verdict,
`info`, loading) reads it as it reads a published folder: config.json built from the metadata,
the tokenizer rebuilt from `tokenizer.ggml.*` by transformers' own GGUF conversion, and gguf.json
naming the file the weights are read from. No weight is copied: the folder holds a few small files
and lives in fastdllm's cache folder, one per version (path, size, mtime) of the file."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..cache_folder import cache_folder
from ..errors import UserError
from .gguf_file import config_for, open_checked, summary

MARKER = "gguf.json"
FORMAT = 3             # bumped when what the folder holds changes: older folders are rebuilt


def folder_for(path: Path) -> Path:
    """The directory standing for the GGUF file `path` (made on first use; refusals first)."""
    # absolute, links kept: a hub snapshot's file is a link to a blob named by its hash, and
    # the folder, `info` and messages should say the file's own name
    path = Path(os.path.abspath(Path(path).expanduser()))
    stat = path.stat()
    key = hashlib.blake2b(f"{FORMAT}\0{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode(), digest_size=8).hexdigest()
    out = cache_folder() / "gguf" / key / path.name        # named after the file: the name commands show
    if (out / MARKER).is_file():
        return out
    f, tensors = open_checked(path)
    config = config_for(f, tensors)
    stops = [config["eos_token_id"]] + [t for t in [f.value("tokenizer.ggml.eot_token_id")] if t is not None]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{path.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write_tokenizer(path, tmp, f)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        generation = {"eos_token_id": list(dict.fromkeys(stops))}
        if (bos := f.value("tokenizer.ggml.bos_token_id")) is not None:
            generation["bos_token_id"] = int(bos)
        (tmp / "generation_config.json").write_text(json.dumps(generation) + "\n")
        (tmp / MARKER).write_text(json.dumps({"file": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                                              "architecture": f.arch, **summary(tensors)}, indent=2) + "\n")
        try:
            os.replace(tmp, out)
        except OSError:             # another process made it first: theirs is the same
            if not (out / MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_tokenizer(path: Path, out: Path, f) -> None:
    """tokenizer.json + tokenizer_config.json (chat template from `tokenizer.chat_template`) from the
    file's vocabulary, merges, token types and special ids, as transformers converts them."""
    from transformers import PreTrainedTokenizerFast

    from .specials import quiet_transformers

    for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens"):
        f.require(key, read=False)
    quiet_transformers()
    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise UserError(f"cannot rebuild the tokenizer of {path.name} from its tokenizer.ggml.* metadata: "
                        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    tokenizer.save_pretrained(out)


def source_of(model_dir: Path) -> dict | None:
    """gguf.json of a folder made by folder_for (the file, its types and bytes), else None."""
    marker = Path(model_dir) / MARKER
    if not marker.is_file():
        return None
    try:
        source = json.loads(marker.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {marker}: {e}") from None
    if not Path(source["file"]).is_file():
        raise UserError(f"{source['file']} is gone (the GGUF file {model_dir.name} stood for)")
    return source
