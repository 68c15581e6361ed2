"""8-bit and 4-bit DiffusionGemma: its experts, read apart and quantized one at a time.

The published checkpoint packs each layer's 128 experts into two 3-D tensors, `experts.gate_up_proj`
(E, 2I, d) with the gate in its first half and `experts.down_proj` (E, d, I): 22.8B of the 25.2B
parameters. bitsandbytes quantizes nn.Linear modules only, so `from_pretrained` would load these at
full size (46 GB in bf16). Decision (docs/specs/diffusion-gemma.md §8): a quantized model holds each
expert as three nn.Linear (models/gemma_layers.ExpertLinears), and they are filled here: one
expert's slices are read from the shard, quantized with the very settings `from_pretrained` used
for every other linear of the model (the same BitsAndBytesConfig), and placed on their layer's
device. At most one expert is ever held at full size; the experts still run once per expert with
tokens (models/moe.run_experts), as the packed ones do."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn


def weight_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return {name: path / shard for name, shard in json.loads(index.read_text())["weight_map"].items()}
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {name: path / "model.safetensors" for name in f.keys()}


def load_experts_apart(model, path: Path, quantization) -> None:
    """Fill every layer's empty ExpertLinears from the packed tensors under `path`, quantized by
    `quantization` (transformers' BitsAndBytesConfig), computing in the model dtype."""
    from ..models.gemma_layers import GeGLU

    files, dtype = weight_files(path), model.embed.weight.dtype
    for i, layer in enumerate(model.blocks):
        prefix = f"model.decoder.layers.{i}.experts."
        device = layer.router.scale.device
        with safe_open(str(files[prefix + "gate_up_proj"]), "pt") as f_gate_up, \
                safe_open(str(files[prefix + "down_proj"]), "pt") as f_down:
            gate_up, down = f_gate_up.get_slice(prefix + "gate_up_proj"), f_down.get_slice(prefix + "down_proj")
            experts, d, inner = down.get_shape()                                      # (E, d, I)
            for e in range(experts):
                gate, up = gate_up[e:e + 1][0].to(dtype).chunk(2, dim=0)              # (I, d) each
                with torch.device("meta"):                                           # the shell only
                    expert = GeGLU(d, inner)
                expert.gate_proj = quantized_linear(gate, quantization, dtype, device)
                expert.up_proj = quantized_linear(up, quantization, dtype, device)
                expert.down_proj = quantized_linear(down[e:e + 1][0].to(dtype), quantization, dtype, device)
                layer.experts.append(expert)


def quantized_linear(weight: torch.Tensor, quantization, dtype: torch.dtype, device) -> nn.Module:
    """A bias-free bitsandbytes linear holding `weight` (out, in), built as transformers builds the
    model's other linears for this BitsAndBytesConfig, quantized by moving it to `device`."""
    import bitsandbytes as bnb

    out_features, in_features = weight.shape
    if quantization.load_in_8bit:
        lin = bnb.nn.Linear8bitLt(in_features, out_features, bias=False, device="meta",
                                  has_fp16_weights=quantization.llm_int8_has_fp16_weight,
                                  threshold=quantization.llm_int8_threshold)
        lin.weight = bnb.nn.Int8Params(weight.cpu(), requires_grad=False,
                                       has_fp16_weights=quantization.llm_int8_has_fp16_weight)
    else:
        lin = bnb.nn.Linear4bit(in_features, out_features, bias=False, device="meta",
                                compute_dtype=quantization.bnb_4bit_compute_dtype or dtype,
                                compress_statistics=quantization.bnb_4bit_use_double_quant,
                                quant_type=quantization.bnb_4bit_quant_type,
                                quant_storage=quantization.bnb_4bit_quant_storage)
        lin.weight = bnb.nn.Params4bit(weight, requires_grad=False, blocksize=lin.weight.blocksize,
                                       compress_statistics=quantization.bnb_4bit_use_double_quant,
                                       quant_type=quantization.bnb_4bit_quant_type,
                                       quant_storage=quantization.bnb_4bit_quant_storage, module=lin)
    return lin.to(device)
