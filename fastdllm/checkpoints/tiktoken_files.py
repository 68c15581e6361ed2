"""A tiktoken encoding as a transformers fast tokenizer, without tiktoken and without the network:
Steerling's Hub folders ship no vocabulary, only `tokenizer_config.json` with `encoding_name
"cl100k_base"` and the special ids (docs/specs/steerling.md 2); their Python downloads the rank file at
first use. fastdllm reads the rank file (`<name>.tiktoken`: one `base64(token bytes) rank` a line)
from the model folder or from tiktoken's own cache, and builds the byte-level BPE that transformers'
TikTokenConverter builds (merges recovered from the ranks, whole-word lookup first), with the
encoding's split pattern. Special ids come from the checkpoint's files, never constants."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from pathlib import Path

from ..errors import UserError

# tiktoken's cl100k_base (tiktoken_ext/openai_public.py): where it downloads the ranks from (its
# cache names the file by the URL's sha1), its split pattern and its own special tokens.
ENCODINGS = {
    "cl100k_base": {
        "url": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "pattern": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
        "specials": {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                     "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276},
    },
}
# Steerling's own tokens (steerling/data/tokenizer.py) and the checkpoint keys holding their ids
STEERLING_TOKENS = {"<|pad|>": "pad_token_id", "<|bos|>": "bos_token_id", "<|endoftext|>": "eos_token_id",
                    "<|endofchunk|>": "endofchunk_token_id", "<|mask|>": "mask_token_id",
                    "<|start_header_id|>": "start_header_id", "<|end_header_id|>": "end_header_id",
                    "<|eot_id|>": "eot_id"}


def is_tiktoken_folder(path: Path) -> bool:
    return "encoding_name" in _json(path / "tokenizer_config.json")


def rank_file(path: Path, name: str) -> Path:
    """The folder's `<name>.tiktoken`, else tiktoken's cached download; a one-line error if neither."""
    spec = ENCODINGS.get(name)
    if spec is None:
        raise UserError(f"{path / 'tokenizer_config.json'}: encoding {name!r} is not one fastdllm knows "
                        f"({', '.join(ENCODINGS)})")
    cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR") \
        or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    for candidate in (path / f"{name}.tiktoken", Path(cache) / hashlib.sha1(spec["url"].encode()).hexdigest()):
        if candidate.is_file():
            return candidate
    raise UserError(f"{path.name}'s tokenizer is tiktoken's {name}, whose rank file is not here: put {name}.tiktoken "
                    f"in {path} or in tiktoken's cache ({cache}); fastdllm downloads nothing at run time")


def read_ranks(file: Path) -> dict[bytes, int]:
    ranks = {}
    for line in file.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def tiktoken_tokenizer(path: Path):
    """The folder's tiktoken encoding with the checkpoint's special tokens, as PreTrainedTokenizerFast."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    settings = {**_json(path / "config.json"), **_json(path / "tokenizer_config.json")}
    name = settings["encoding_name"]
    ranks = read_ranks(rank_file(path, name))

    class FromRanks(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(_):
            return ranks

    vocab, merges = FromRanks(vocab_file=str(path)).extract_vocab_merges_from_model(None)
    specials = {t: i for t, i in ENCODINGS[name]["specials"].items() if t != "<|endoftext|>"} \
        if len(ranks) > 100000 else {}          # a small rank file (tests) has no FIM tokens
    specials.update({t: settings[k] for t, k in STEERLING_TOKENS.items() if isinstance(settings.get(k), int)})
    # the ids are the checkpoint's: in the model's vocabulary first, so that the added tokens keep them
    tokenizer = Tokenizer(BPE({**vocab, **specials}, merges, fuse_unk=False))
    tokenizer.model.ignore_merges = True                 # a whole pre-token in the ranks is one id (tiktoken)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(ENCODINGS[name]["pattern"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    named = {"pad_token": "<|pad|>", "bos_token": "<|bos|>", "eos_token": "<|endoftext|>", "mask_token": "<|mask|>"}
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, chat_template=settings.get("chat_template"),
                                   **{k: v for k, v in named.items() if v in specials},
                                   additional_special_tokens=[t for t in specials if t not in named.values()])


def _json(file: Path) -> dict:
    try:
        value = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
