"""SDAR (JetLM/SDAR-1.7B-Chat, -4B-Chat, -8B-Chat): Qwen3 config keys and tensor names (per-head
q_norm / k_norm, explicit head_dim, no bias), trained for block diffusion (docs/specs/sdar.md).

Attention is block-causal: causal between blocks of `block_size` (4 when the config, as originally
published, has no such key), bidirectional inside one. No logit shift: position p is predicted from
its own hidden state. The mask is `mask_token_id` when the config has it, else the tokenizer's
`<|MASK|>` token."""

from __future__ import annotations

from .attention import Attention
from .config_guard import Switch
from .qwen import QwenConfig, QwenLM
from .registry import Family


class SDARConfig(QwenConfig):
    model_type = "sdar"
    family_defaults = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                           num_key_value_heads=8, head_dim=128)

    switches = (*QwenConfig.switches, Switch("attention_bias", (False, None), "biases on q, k, v and o"))
    # block_size: the attention block (the authors' code reads it for training; their generate's default 4)
    reads = {*QwenConfig.reads, "block_size"}
    # fuse_cross_entropy: training only; the rest is never read by the authors' modeling code
    harmless = {*QwenConfig.harmless, "fuse_cross_entropy", "micro_forward", "debug", "skip_checkpoint",
                "use_deepep", "ep_size"}


class SDARForCausalLM(QwenLM):
    authors_softmax = "logits"      # their sampler: softmax(logits / T) in the model dtype (docs/specs/sdar.md 4.3)
    config_class = SDARConfig
    _no_split_modules = ["QwenDecoderLayer"]
    bias = False
    qk_norm = True
    mask_tokens = ("<|MASK|>", "<MASK>")

    @property
    def attention(self) -> Attention:
        return Attention("block-causal", int(getattr(self.config, "block_size", None) or 4))


# config.json's model_type -> the classes that read it (models/registry.py)
SERVES = {"sdar": Family(SDARConfig, SDARForCausalLM, ("SDARForCausalLM",))}

# how it decodes when no profile says otherwise, and what its checkpoints are called (models/registry.py)
DECODES = {"sdar": {"profile": "sdar", "fixed": {"rule": "dynamic", "threshold": 0.95, "cache": "prefix"},
                    "from_config": {"block_len": ["block_size", 4]}}}
NAMES = {"sdar": ["SDAR", "TraDo"]}
