"""iLLaDA (GSAI-ML/iLLaDA-8B-Base, -Instruct): `ILLaDAForCausalLM`, docs/specs/illada.md.

LLaDA's successor in Llama's layout: the Qwen/Llama decoder of qwen.py without biases (GQA 32/8,
rotate-half RoPE over the whole head, SwiGLU, Llama-order RMSNorm), fully bidirectional, logits for
position p read at p (no shift), the head tied to the embedding. Mask `<[MASK]>` = id 5 (the authors'
`mask_id=5`; config.json names none).

Unconfirmed (no config.json was read, docs/specs/illada.md 1.1): the model_type, so the family is also
found by its architecture name (BY_ARCHITECTURE below); rope_theta and rms_norm_eps,
so a config.json without them is refused rather than filled with a guess."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from ..errors import UserError
from .config_guard import REQUIRED, Switch, number
from .qwen import QwenConfig, QwenLM
from .registry import Family

MASK_TOKEN, MASK_ID = "<[MASK]>", 5
# The model card's sizes (docs/specs/illada.md 1.1), used only where a config.json omits a key.
ILLADA_SIZES = dict(vocab_size=155136, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)


def default_rope(value, raw) -> bool:
    """M's rotary: no scaling, or the default type at factor 1 (it raises on anything else)."""
    if value is None:
        return True
    kind = isinstance(value, dict) and (value.get("rope_type") or value.get("type"))
    return kind == "default" and value.get("factor", 1) in (1, 1.0)


class ILLaDAConfig(QwenConfig):
    model_type = "illada"
    family_defaults: ClassVar[dict] = dict(ILLADA_SIZES)

    def __init__(self, tie_word_embeddings: bool = True, **kwargs):     # the model card: tied
        QwenConfig.__init__(self, tie_word_embeddings=tie_word_embeddings, **kwargs)

    # what M (modeling_illada.py) reads to change the forward (docs/specs/illada.md 1.1, 7.1)
    switches = (
        Switch("hidden_act", ("silu",), "another MLP activation"),
        Switch("rope_scaling", default_rope, "a scaled rotary embedding"),
        Switch("layer_norm_eps", (None,), "LayerNorm with biases in place of every RMSNorm, unverified"),
        Switch("attention_bias", (False, None), "biases on q, k, v and o"),
        Switch("mlp_bias", (False, None), "biases on the MLP"),
        Switch("rope_theta", number, "the rotary base, not known for iLLaDA", REQUIRED),
        Switch("rms_norm_eps", number, "the RMSNorm epsilon, not known for iLLaDA", REQUIRED),
    )
    reads = {*QwenConfig.reads, "mask_token_id"}
    # training-only keys M reads (dropouts, init), and the rotary buffer's name
    harmless = {"resid_pdrop", "embd_pdrop", "attention_dropout", "initializer_range", "pretraining_tp"}


class ILLaDAForCausalLM(QwenLM):
    config_class = ILLaDAConfig
    _no_split_modules = ["QwenDecoderLayer"]
    bias = False
    # the authors' confidence: softmax(logits) in the logits' dtype (docs/specs/illada.md 3.1)
    authors_softmax = "logits"
    mask_tokens = (MASK_TOKEN,)
    mask_fallback = MASK_ID
    # the authors decode one unpadded row at a time (G1 asserts batch 1; M's 2-D mask is unchecked):
    # the engine refuses a padded batch with this line, serve decodes such rows one at a time
    padded_batch_refusal = "iLLaDA: padded batches are not the authors' path (batch 1)"
    # the chat template was not published where we could read it; a plain transcript would change
    # the Instruct model's answers (docs/specs/illada.md 2, 8)
    plain_chat_refusal = ("iLLaDA: chat needs the checkpoint's chat template, and this one has none (a plain "
                  "transcript would change its answers); use `generate --raw` for plain text")

    @staticmethod
    def mask_of(config: dict, tokenizer) -> int:
        """The mask id: config.json's mask_token_id, else the authors' 5; the tokenizer must name it
        `<[MASK]>` (the authors' id 5 is not looked up by spelling: a tokenizer that puts the
        spelling elsewhere is another vocabulary). One line otherwise."""
        mask = config.get("mask_token_id")
        mask = mask if isinstance(mask, int) else MASK_ID
        named = tokenizer.convert_ids_to_tokens(mask) if mask < len(tokenizer) else None
        if named != MASK_TOKEN:
            raise UserError(f"iLLaDA: mask token `{MASK_TOKEN}` (id {mask}) not found (the tokenizer's id {mask} "
                            f"is {named!r})")
        return mask

    @classmethod
    def check_loaded(cls, report: dict) -> None:
        # an absent lm_head.weight is the tied head (read_files), never left random
        missing = [n for n in report.get("missing_keys") or [] if n != "lm_head.weight"]
        super().check_loaded({**report, "missing_keys": missing})

    def read_files(self, folder: Path) -> None:
        """tie_word_embeddings false but no lm_head.weight in the shards: the embedding is the head,
        as the third-party loaders tie it (docs/specs/illada.md 1.2)."""
        if self.lm_head is not None and "lm_head.weight" not in stored_names(Path(folder)):
            self.set_output_head(None)


def stored_names(folder: Path) -> set[str]:
    """The tensor names the checkpoint's safetensors hold (the index's, else the single file's)."""
    import json

    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


# config.json's model_type -> the classes that read it (models/registry.py)
SERVES = {"illada": Family(ILLaDAConfig, ILLaDAForCausalLM, ("ILLaDAForCausalLM",))}
# iLLaDA's model_type was only ever seen in third-party test doubles ("illada", docs/specs/illada.md 1.1),
# its class name in loaders that read the real file: the architecture names the family whatever
# config.json's model_type says (with a note). If the published type differs, serve it here too.
BY_ARCHITECTURE = {"ILLaDAForCausalLM": "illada"}

# how it decodes when no profile says otherwise, and what its checkpoints are called (models/registry.py)
# iLLaDA's var_generate (docs/specs/illada.md 3.2): the canvas grows by blocks of 32; found by its class
# name whatever its model_type
DECODES = {"illada": {"profile": "illada", "fixed": {"block_len": 32, "variable_length": True}},
           "ILLaDAForCausalLM": "illada"}
NAMES = {"illada": ["iLLaDA"]}
