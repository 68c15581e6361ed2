"""Fast-dLLM v2 (Efficient-Large-Model/Fast_dLLM_v2_1.5B, _7B): Qwen2.5 config keys and tensor
names (q/k/v bias), fine-tuned for block diffusion (docs/specs/fast-dllm-v2.md).

Attention is block-causal: causal between blocks of `bd_size` (32), bidirectional inside one.
Logits are shifted by one like Dream's (position p is predicted from the hidden state at p - 1),
so a block's first token is predicted by the forward that completes the block before it. No mask
key in config.json: the mask is the tokenizer's `|<MASK>|` token."""

from __future__ import annotations

from .attention import Attention
from .config_guard import Switch
from .qwen import QwenConfig, QwenLM
from .registry import Family


def full_attention_only(value, raw) -> bool:
    return isinstance(value, list) and all(kind == "full_attention" for kind in value)


class FastDLLMQwenConfig(QwenConfig):
    model_type = "Fast_dLLM_Qwen"
    family_defaults = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                           num_attention_heads=28, num_key_value_heads=4)
    # layer_types: the authors' inference ignores a window there too; refused rather than guessed
    switches = (*QwenConfig.switches, Switch("layer_types", full_attention_only, "sliding-window layers"))
    reads = {*QwenConfig.reads, "bd_size"}
    harmless = {*QwenConfig.harmless, "conplemenrary_mask"}     # (sic) never read by the authors' code


class FastDLLMQwenForCausalLM(QwenLM):
    authors_softmax = "logits"      # softmax(logits) in the model dtype (docs/specs/fast-dllm-v2.md Q7)
    config_class = FastDLLMQwenConfig
    _no_split_modules = ["QwenDecoderLayer"]
    logit_shift = 1
    mask_tokens = ("|<MASK>|",)

    @property
    def attention(self) -> Attention:
        return Attention("block-causal", int(getattr(self.config, "bd_size", None) or 32))


# config.json's model_type -> the classes that read it (models/registry.py)
SERVES = {"Fast_dLLM_Qwen": Family(FastDLLMQwenConfig, FastDLLMQwenForCausalLM, ("Fast_dLLM_QwenForCausalLM",))}

# how it decodes when no profile says otherwise, and what its checkpoints are called (models/registry.py)
DECODES = {"Fast_dLLM_Qwen": {"profile": "fast-dllm-v2",
                              "fixed": {"sub_block_len": 8, "rule": "dynamic", "threshold": 0.9, "cache": "prefix"},
                              "from_config": {"block_len": ["bd_size", 32]}}}
NAMES = {"Fast_dLLM_Qwen": ["Fast-dLLM v2"]}
