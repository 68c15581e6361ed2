"""What a request is decoded against (Server: the model and the server's own settings) and what a
request becomes once protocol.py has read it (Prepared: prompt ids, a DecodeConfig, stop strings,
the stream's options)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..decode.config import DecodeConfig


@dataclass(frozen=True)
class Server:
    """What requests are decoded against: the model and the server's own settings."""
    lm: Any                         # loading.LoadedModel
    base_cfg: DecodeConfig          # from the server's profile and flags
    profile_name: str
    cli_flags: dict[str, Any]       # decoding flags given to `fastdllm serve`
    name: str | None = None         # the name it was asked by (-m dream:7b); else its folder's

    @property
    def model_name(self) -> str:
        return self.name or self.lm.path.name


@dataclass(frozen=True)
class Prepared:
    prompt: list[int]
    cfg: DecodeConfig               # gen_len = the canvas: max_tokens rounded up to whole blocks
    max_tokens: int
    profile: str
    stop: tuple[str, ...] = ()
    steps: bool = False             # stream each step's committed positions and tokens
    stream: bool = False
    include_usage: bool = False
    plain_chat: bool = False        # no chat template: the answer is cut and stripped as in `fastdllm chat`
    suffix: list[int] | None = None  # infilling: the answer is decoded between prompt and suffix
    constraint: Any = None          # structured output: decode.constraint.Compiled, or None
    tools: Any = None               # tool calls: serve/tools.Tools, or None

    def info(self) -> dict:
        """The `fastdllm` object of a response: what was decoded for this request."""
        out = {"max_tokens": self.max_tokens, "canvas_tokens": self.cfg.gen_len, "profile": self.profile}
        if self.cfg.gen_len != self.max_tokens:
            out["note"] = f"max_tokens rounded up to whole blocks of {self.cfg.block_len}"
        return out
