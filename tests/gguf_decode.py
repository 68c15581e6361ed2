"""Decoding a GGUF file's model the way the GGUF tests compare it, per prompt (canvas tokens, NFE): the
tiny LLaDA's settings and chat prompts (CFG: 24 tokens, blocks of 8, dual cache, threshold 0.7; PROMPTS;
decode), used by tests/gguf/test_gguf.py, test_gguf_int4.py (CFG) and test_gguf_fallbacks.py; and the
Qwen-layout families' (QWEN_CFG: 16 tokens; QWEN_PROMPTS; decode_qwen, chat where the checkpoint has a
template), used by tests/gguf/test_gguf_families.py and test_gguf_fallbacks.py. The GGUF files
themselves come from tests/gguf/gguf_writer.py."""

from __future__ import annotations

from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run

CFG = DecodeConfig(gen_len=24, block_len=8, cache="dual", rule="threshold", threshold=0.7, early_stop=False)
PROMPTS = ["Hi.", "What is 2 + 2?"]
QWEN_CFG = DecodeConfig(gen_len=16, block_len=8, cache="dual", rule="threshold", threshold=0.7, early_stop=False)
QWEN_PROMPTS = ["Hi.", "What is 2 + 2?"]


def decode(lm) -> list:
    """The tiny LLaDA (or its GGUF twin): PROMPTS as chat, each alone under CFG."""
    prompts = [lm.encode(p, chat=True) for p in PROMPTS]
    return [(r.canvas[0].tolist(), r.nfe) for r in (run(lm.decoder, [p], CFG) for p in prompts)]


def decode_qwen(lm) -> list:
    """A Qwen-layout family (Dream, RND1, LLaDA-MoE): QWEN_PROMPTS, chat if it has a template, each alone
    under QWEN_CFG."""
    chat = lm.has_chat_template
    return [(r.canvas[0].tolist(), r.nfe) for r in (run(lm.decoder, [lm.encode(p, chat=chat)], QWEN_CFG)
                                                    for p in QWEN_PROMPTS)]
