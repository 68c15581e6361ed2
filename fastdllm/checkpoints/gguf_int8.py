"""GGUF tensors kept quantized on the CPU (docs/gguf.md 10, 11): each block linear's quantized tensor
goes straight into fastdllm's int8 rows (models/cpu_quant.py) or int4 groups (models/cpu_int4.py)
without a bf16 copy of the model. This module is the mechanism both share; which GGUF type goes to
which kernel is `int8_kernels` here (`--quantize int8`) and gguf_int4.py's `int4_kernels`.

No GGUF type maps exactly onto fastdllm's layouts (sections 10, 11), so each tensor is re-quantized:
the gguf package dequantizes gguf_file.CHUNK values' worth of rows at a time (float32, exact for every type
read here) and fastdllm's own per-row quantizer takes them. Both work row by row, so chunking and
putting the converter's q/k rows back after quantizing change nothing.

While the model is built, each such weight is a stride-0 view of one zero (no memory); the quantized
linear then takes the file's codes in its place, before q/k/v and gate/up would be fused (kept
linears stay apart: one matmul each)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .gguf_arch import arch_of
from .gguf_file import QUANTIZED, GGUFTensor, dequantized, open_checked, release, row_chunks, unpermute_rows

ROUTERS = ("mlp.gate",)      # MoE routers stay float (as --quantize int8 keeps them for a folder)

KernelFor = Callable[[GGUFTensor], "str | None"]      # a tensor -> "int8", "int4" or None (float)


def int8_kernels(t: GGUFTensor) -> str | None:
    """--quantize int8: every quantized GGUF type fastdllm reads (Q8_0, the 4-bit types and their
    k-quant companions) goes to int8 rows."""
    return "int8" if t.type in QUANTIZED else None


def state_dict_int8(path: Path, config: dict, dtype) -> tuple[dict, dict]:
    return state_dict_kept(path, config, dtype, int8_kernels)


def state_dict_kept(path: Path, config: dict, dtype, kernel_for: KernelFor) -> tuple[dict, dict]:
    """(state dict, codes): block weights `kernel_for` keeps, as stand-ins of their shape, with
    `codes` = {published name: (kernel, GGUF type, the quantized linear's tensors)}; everything else
    as gguf_file.state_dict gives it (the embedding and the output head included: fastdllm's int8
    makes them from those, as for a folder)."""
    f, tensors = open_checked(path)
    arch = arch_of(f)
    weights, codes = {}, {}
    for t in tensors:
        block_linear = (t.name.startswith(arch.prefix) and len(t.shape) >= 2
                        and not t.name.removesuffix(".weight").endswith(ROUTERS))
        kernel = kernel_for(t) if block_linear else None
        names = [t.name.format(e=e) for e in range(t.shape[0])] if "{e}" in t.name else [t.name]
        if kernel is None:                           # one tensor at a time, straight into `dtype`
            array = dequantized(t, arch, config, dtype)
            weights.update(zip(names, list(array) if "{e}" in t.name else [array]))
            del array
        else:
            rows = quantized_rows(t, arch, config, kernel, dtype)           # (E * out, ...) each
            n = t.shape[-2]
            for e, name in enumerate(names):
                mine = tuple(x[e * n:(e + 1) * n] for x in rows)
                codes[name] = (kernel, t.type, mine if kernel == "int8" else four_bit_buffers(mine, dtype))
                weights[name] = torch.zeros((), dtype=dtype).expand(t.shape[-2:])   # stride 0: no memory
            del rows
        release(f, t)
    return weights, codes


def quantized_rows(t: GGUFTensor, arch, config: dict, kernel: str, dtype) -> tuple[torch.Tensor, ...]:
    """fastdllm's per-row quantization of the tensor's rows (experts stacked: E * out rows), in the
    published row order: int8 (q (R, K) int8, scale (R,)), int4 (q (R, K) int32, m (R, K/32) int8,
    row (R,) fp32), made from the gguf package's dequantization a chunk of rows at a time."""
    from ..models.cpu_int4 import quantize_int4
    from ..models.cpu_quant import quantize_int8

    quantize = (lambda w: quantize_int8(w, dtype)) if kernel == "int8" else quantize_int4
    parts = [quantize(torch.from_numpy(rows)) for _, rows in row_chunks(t)]
    out = tuple(torch.cat(p) if len(p) > 1 else p[0] for p in zip(*parts))
    module = t.name.rsplit(".", 2)[-2]
    if module in arch.permuted:                      # the converter's q/k row order, per row: undone after
        out = tuple(unpermute_rows(x, config[arch.permuted[module]]).contiguous() for x in out)
    return out


def four_bit_buffers(rows: tuple, dtype) -> dict:
    from ..models.cpu_int4 import int4_buffers

    return int4_buffers(*(x.contiguous() for x in rows), dtype)


def place_kept(model: nn.Module, weights: dict, codes: dict, dtype) -> Counter:
    """Each linear whose weight is a stand-in from state_dict_kept becomes an Int8Linear or
    Int4Linear holding the file's codes (found by the stand-in's storage: module names may differ
    from published ones). Returns {(kernel, GGUF type): linears}."""
    from ..models.cpu_int4 import Int4Linear
    from ..models.cpu_quant import Int8Linear

    by_storage = {weights[name].data_ptr(): name for name in codes}
    placed = Counter()
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is not nn.Linear or (name := by_storage.get(child.weight.data_ptr())) is None:
                continue
            kernel, qtype, held = codes.pop(name)
            if kernel == "int8":
                lin = Int8Linear(child, dtype, codes=held)
            else:
                lin = Int4Linear(child, dtype, buffers=held)
            setattr(module, child_name, lin)
            placed[kernel, qtype] += 1
    if codes:
        raise ValueError(f"quantized codes with no linear to hold them: {', '.join(sorted(codes)[:3])}")
    return placed
