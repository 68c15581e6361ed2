"""Q8_0 kept quantized on the CPU (`--quantize int8` on a GGUF file, docs/gguf.md section 10): each
block linear's Q8_0 tensor goes straight into fastdllm's int8 layout (models/cpu_quant.py: one
symmetric scale per row) without a bf16 copy of the model.

Q8_0 stores w = d_b * q_b for blocks b of 32 values along a row (d_b fp16, q_b int8). fastdllm's
kernels take one scale s per row (w = s * q). d_b * q_b is exact in float32 (11 + 7 significant
bits), so the tensor is dequantized in float32 one tensor at a time and re-quantized per row by
`quantize_int8`: the only new rounding is that one (section 10 has the measured error).

While the model is built, each such weight is a stride-0 view of one zero (no memory); the Int8Linear
then takes the file's codes in its place, before q/k/v and gate/up would be fused (int8 linears stay
apart: one matmul each)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .gguf_arch import arch_of
from .gguf_file import float32, open_checked

KEPT = ("Q8_0",)             # the GGUF types kept quantized by --quantize int8
ROUTERS = ("mlp.gate",)      # MoE routers stay float (as --quantize int8 keeps them for a folder)


def state_dict_int8(path: Path, config: dict, dtype) -> tuple[dict, dict]:
    """(state dict, codes): block weights of a kept type as stand-ins of their shape in `codes`
    ({published name: (q (N, K) int8, scale (N,) in dtype)}); everything else as state_dict gives it
    (the embedding and the output head included: fastdllm's int8 makes them from those)."""
    from ..models.cpu_quant import quantize_int8

    f, tensors = open_checked(path)
    arch = arch_of(f)
    weights, codes = {}, {}
    for t in tensors:
        kept = (t.type in KEPT and t.name.startswith(arch.prefix) and len(t.shape) >= 2
                and not t.name.removesuffix(".weight").endswith(ROUTERS))
        array = torch.from_numpy(float32(t, arch, config))              # one tensor at a time, float32
        names = [t.name.format(e=e) for e in range(t.shape[0])] if "{e}" in t.name else [t.name]
        slices = list(array) if "{e}" in t.name else [array]
        for name, w in zip(names, slices):
            if kept:
                codes[name] = quantize_int8(w, dtype)
                weights[name] = torch.zeros((), dtype=dtype).expand(w.shape)   # stride 0: no memory
            else:
                weights[name] = w.to(dtype)
        del array, slices
    return weights, codes


def place_int8(model: nn.Module, weights: dict, codes: dict, dtype) -> int:
    """Each linear whose weight is a stand-in from state_dict_int8 becomes an Int8Linear holding the
    file's codes. Found by the stand-in's storage (module names may differ from published ones)."""
    from ..models.cpu_kernels import QuantLinear, w8a8_rows
    from ..models.cpu_quant import Int8Linear

    by_storage = {weights[name].data_ptr(): name for name in codes}
    placed = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is not nn.Linear or (name := by_storage.get(child.weight.data_ptr())) is None:
                continue
            lin = Int8Linear.__new__(Int8Linear)
            QuantLinear.__init__(lin, child, dtype)                  # sizes and bias from the linear
            q, scale = codes.pop(name)
            lin.register_buffer("weight", q)                          # (N, K) int8
            lin.register_buffer("scales", scale)                      # (N,)
            lin.w8a8_rows = w8a8_rows(False)
            setattr(module, child_name, lin)
            placed += 1
    if codes:
        raise ValueError(f"int8 codes with no linear to hold them: {', '.join(sorted(codes)[:3])}")
    return placed
