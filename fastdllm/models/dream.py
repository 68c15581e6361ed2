"""Dream-v0 (Base, Instruct), Dream-Coder and DiffuCoder: Qwen2 config keys and tensor names.

Dream was adapted from an autoregressive Qwen2.5, so the token at position p is predicted from the
hidden state at p - 1 (`logit_shift = 1`). The engine never sees this: it asks for logits at canvas
positions and `forward_span` widens the span by one slot on the left when needed."""

from __future__ import annotations

from .qwen import QwenConfig, QwenLM
from .registry import Family


class DreamConfig(QwenConfig):
    model_type = "Dream"
    family_defaults = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                           num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072,
                           mask_token_id=151666)
    harmless = {*QwenConfig.harmless, "use_mrope"}              # not a key of the authors' DreamConfig


class DreamModel(QwenLM):
    config_class = DreamConfig
    _no_split_modules = ["QwenDecoderLayer"]
    logit_shift = 1
    feature_cache = True            # its layer hosts dLLM-Cache's (models/feature_cache.py)
    authors_softmax = "logits"      # generation_utils_block: torch.softmax of uncast logits (docs/specs/ranking.md)
    eval_prompt_bos = True          # their eval scripts (add_bos_token=true) put <|beginoftext|> before a
                                    # prompt they do not chat-template; the tokenizer itself adds none


# config.json's model_type -> the classes that read it (models/registry.py)
SERVES = {"Dream": Family(DreamConfig, DreamModel, ("DreamModel",))}

# what its checkpoints are called (models/registry.py)
NAMES = {"Dream": ["Dream", "DiffuCoder"]}
