"""SDAR (JetLM/SDAR-1.7B-Chat, -4B-Chat, -8B-Chat): Qwen3 config keys and tensor names (per-head
q_norm / k_norm, explicit head_dim, no bias), trained for block diffusion (docs/sdar.md).

Attention is block-causal: causal between blocks of `block_size` (4 when the config, as originally
published, has no such key), bidirectional inside one. No logit shift: position p is predicted from
its own hidden state. The mask is `mask_token_id` when the config has it, else the tokenizer's
`<|MASK|>` token."""

from __future__ import annotations

from .attention import Attention
from .qwen import QwenConfig, QwenLM


class SDARConfig(QwenConfig):
    model_type = "sdar"
    family_defaults = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                           num_key_value_heads=8, head_dim=128, rope_theta=1000000.0)

    def unsupported(self) -> list[str]:
        return super().unsupported() + (["attention_bias=True"] if getattr(self, "attention_bias", False) else [])


class SDARForCausalLM(QwenLM):
    config_class = SDARConfig
    _no_split_modules = ["QwenDecoderLayer"]
    bias = False
    qk_norm = True
    mask_tokens = ("<|MASK|>", "<MASK>")

    @property
    def attention(self) -> Attention:
        return Attention("block-causal", int(getattr(self.config, "block_size", None) or 4))
