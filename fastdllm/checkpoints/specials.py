"""A checkpoint's tokenizer and special ids, as the checkpoint declares them: the mask (config,
tokenizer, or the family's published fallback), the stops (config and generation config eos, the
chat template's end of turn) and the padding. Never constants, never a checkpoint's Python."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..decode.decoder import SpecialTokens
from ..errors import UserError

if TYPE_CHECKING:
    from ..models.base import DiffusionLM

_PROBE = "fastdllm-end-of-turn-probe"


def load_tokenizer(path: Path):
    """LLaDA ships tokenizer.json; Dream ships the slow Qwen2 files (vocab.json + merges.txt).
    A checkpoint loaded again in the same process (bench --quantize's unquantized twin, a test run)
    gets the tokenizer read the first time while its files are unchanged: building Qwen's BPE from
    vocab.json and merges.txt takes 0.2-0.3 s. fastdllm never changes a tokenizer it loaded."""
    key = _tokenizer_files(path)
    if key not in _TOKENIZERS:
        if len(_TOKENIZERS) >= 8:
            _TOKENIZERS.pop(next(iter(_TOKENIZERS)))
        _TOKENIZERS[key] = _read_tokenizer(path)
    return _TOKENIZERS[key]


_TOKENIZERS: dict[tuple, object] = {}          # _tokenizer_files(path) -> tokenizer, oldest first
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _tokenizer_files(path: Path) -> tuple:
    """The directory and a digest of every file in it but the weights (names and contents: a few
    MB, ~10 ms; a file rewritten within the clock's tick is still seen)."""
    digest = hashlib.blake2b(digest_size=16)
    try:
        for f in sorted(Path(path).iterdir()):
            if f.is_file() and not f.name.endswith(_WEIGHTS):
                digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    except OSError:
        pass
    return str(Path(path).resolve()), digest.hexdigest()


def _read_tokenizer(path: Path):
    from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

    from .tiktoken_files import is_tiktoken_folder, tiktoken_tokenizer

    quiet_transformers()
    if is_tiktoken_folder(path):                # Steerling: a tiktoken encoding named, no vocabulary file
        return tiktoken_tokenizer(path)
    try:
        if (path / "tokenizer.json").is_file():
            return PreTrainedTokenizerFast.from_pretrained(path, trust_remote_code=False)
        if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
            return Qwen2Tokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError, TypeError) as e:
        raise UserError(f"cannot read the tokenizer in {path}: {str(e).splitlines()[0]}") from None
    raise UserError(f"{path} has no tokenizer files (tokenizer.json, or vocab.json + merges.txt)")


def quiet_transformers() -> None:
    """No "Loading weights" progress bars or "tokenizer class DreamTokenizer differs" notes on a
    user's terminal: our errors say what went wrong."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def mask_from_tokenizer(tokenizer, spellings: tuple[str, ...]) -> int | None:
    """The tokenizer's mask_token, else the first of the family's spellings it knows."""
    for token in (getattr(tokenizer, "mask_token", None), *spellings):
        if token is not None and (i := token_id(tokenizer, token)) is not None:
            return i
    return None


def token_id(tokenizer, token: str) -> int | None:
    """The id of `token` as one entry of the vocabulary, else None (asked of the tokenizer, not
    of get_vocab(): a 150k-entry dict built at each call, 50 ms)."""
    i = tokenizer.convert_tokens_to_ids(token)
    return i if isinstance(i, int) and tokenizer.convert_ids_to_tokens(i) == token else None


def special_tokens(config: dict, tokenizer, path: Path, model_cls: type[DiffusionLM]) -> SpecialTokens:
    """Mask: config's mask_token_id, else the tokenizer's, else the family's `mask_fallback` (the authors' code);
    -1 for a family whose canvas is noise, not masks (DiffusionGemma: its `<mask>` is an ordinary
    token it may write, and -1 marks the canvas slots not decoded yet)."""
    mask = config.get("mask_token_id") if model_cls.uses_mask else -1
    if model_cls.mask_of is not None:          # a family that checks its own (iLLaDA)
        mask = model_cls.mask_of(config, tokenizer)
    if not isinstance(mask, int):
        mask = mask_from_tokenizer(tokenizer, model_cls.mask_tokens)
    fallback = model_cls.mask_fallback
    if not isinstance(mask, int) and isinstance(fallback, int) and fallback < config.get("vocab_size", 0):
        mask = fallback
    if not isinstance(mask, int):
        raise UserError(f"{path / 'config.json'} has no mask_token_id and the tokenizer no mask token")
    eos = _ids(config.get("eos_token_id")) or _ids(tokenizer.eos_token_id)
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        try:
            eos += _ids(json.loads(gen_file.read_text()).get("eos_token_id"))
        except (OSError, ValueError, AttributeError):
            pass
    if model_cls.end_tokens is not None:       # a family that names its own (Steerling)
        eot, extra = model_cls.end_tokens(config, tokenizer)
    else:
        eot, extra = end_of_turn(tokenizer), []
    stops = tuple(dict.fromkeys(eos + extra + ([eot] if eot is not None else [])))
    if not stops:
        raise UserError(f"{path} declares no eos_token_id")
    pad = config.get("pad_token_id")
    pad = pad if isinstance(pad, int) else (tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0])
    if pad == mask:
        raise UserError(f"{path}: pad_token_id equals mask_token_id ({mask})")
    return SpecialTokens(mask=mask, pad=pad, stops=stops, eot=eot)


def end_of_turn(tokenizer) -> int | None:
    """The special token the chat template puts right after an assistant message, if any."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}], tokenize=False)
    except Exception:  # a template that rejects this conversation: no end-of-turn known
        return None
    rest = text[text.find(_PROBE) + len(_PROBE):] if _PROBE in text else ""
    ids = tokenizer(rest, add_special_tokens=False)["input_ids"] if rest else []
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    return ids[0] if ids and ids[0] in special else None


def _ids(value) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []
