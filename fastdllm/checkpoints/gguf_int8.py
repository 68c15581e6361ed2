"""GGUF tensors kept quantized on the CPU (docs/specs/gguf.md 10, 11): each block linear's quantized tensor
goes straight into fastdllm's int8 rows (models/cpu_quant.py) or int4 groups (models/cpu_int4.py)
without a bf16 copy of the model, and the embedding and output head of a quantized type into int8
rows (`ends_kept`). This module is the mechanism both share; which GGUF type goes to which kernel is
`int8_kernels` here (`--quantize int8`) and gguf_int4.py's `int4_kernels`.

No GGUF type maps exactly onto fastdllm's layouts (sections 10, 11), so each tensor is re-quantized:
the gguf package dequantizes gguf_file.CHUNK values' worth of rows at a time (float32, exact for every type
read here) and fastdllm's own per-row quantizer takes them. Both work row by row, so chunking and
putting the converter's q/k rows back after quantizing change nothing.

While the model is built, each such weight is a stride-0 view of one zero (no memory); the quantized
linear then takes the file's codes in its place, before q/k/v and gate/up would be fused (kept
linears stay apart: one matmul each)."""

from __future__ import annotations

import math
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
    """(state dict, codes): block weights `kernel_for` keeps, and the embedding and output head of
    a quantized type where fastdllm's int8 would hold them (`ends_kept`), as stand-ins of their
    shape, with `codes` = {published name: (kernel, GGUF type, the quantized module's tensors)};
    everything else as gguf_file.state_dict gives it."""
    f, tensors = open_checked(path)
    arch = arch_of(f)
    ends = ends_kept(arch, tensors)
    weights, codes = {}, {}
    for t in tensors:
        block_linear = (t.name.startswith(arch.prefix) and len(t.shape) >= 2
                        and not t.name.removesuffix(".weight").endswith(ROUTERS))
        kernel = kernel_for(t) if block_linear else ends.get(t.name)
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


def ends_kept(arch, tensors: list[GGUFTensor]) -> dict[str, str]:
    """{published name: "int8"} for the embedding and the output head that go straight from the file
    into int8 rows (one rounding from the float32 dequantization, no copy in the compute dtype):
    those of a quantized type that loading.cpu_quantize would make int8 anyway (quantize_model: the
    embedding whenever the head is its own matrix, the head where W8A8 pays, a tied matrix only
    then). F32/F16/BF16 ends stay as they are: fastdllm's int8 makes them as for a folder."""
    from ..models.cpu_quant import head_pays

    embed, head = arch.globals["token_embd.weight"], arch.globals["output.weight"]
    by_name = {t.name: t for t in tensors}
    pays = head_pays()
    wanted = {embed: pays if head not in by_name else True, head: pays}
    return {name: "int8" for name, want in wanted.items()
            if want and name in by_name and by_name[name].type in QUANTIZED}


def quantized_rows(t: GGUFTensor, arch, config: dict, kernel: str, dtype) -> tuple[torch.Tensor, ...]:
    """fastdllm's per-row quantization of the tensor's rows (experts stacked: E * out rows), in the
    published row order: int8 (q (R, K) int8, scale (R,)), int4 (q (R, K) int32, m (R, K/32) int8,
    row (R,) fp32), made from the gguf package's dequantization a chunk of rows at a time."""
    from ..models.cpu_int4 import quantize_int4
    from ..models.cpu_quant import quantize_int8

    quantize = (lambda w: quantize_int8(w, dtype)) if kernel == "int8" else quantize_int4
    rows_total, out = math.prod(t.shape[:-1]), None
    for i, rows in row_chunks(t):          # into tensors made once: no list of parts, no concatenation
        part = quantize(torch.from_numpy(rows))
        if out is None:
            out = tuple(torch.empty((rows_total, *x.shape[1:]), dtype=x.dtype) for x in part)
        for whole, x in zip(out, part):
            whole[i:i + len(x)] = x
        del part, rows
    module = t.name.rsplit(".", 2)[-2]
    if module in arch.permuted:                      # the converter's q/k row order, per row: undone after
        out = tuple(unpermute_rows(x, config[arch.permuted[module]]).contiguous() for x in out)
    return out


def four_bit_buffers(rows: tuple, dtype) -> dict:
    from ..models.cpu_int4 import int4_buffers

    return int4_buffers(*(x.contiguous() for x in rows), dtype)


def place_kept(model: nn.Module, weights: dict, codes: dict, dtype) -> Counter:
    """Each linear whose weight is a stand-in from state_dict_kept becomes an Int8Linear or
    Int4Linear holding the file's codes, the embedding an Int8Embedding (found by the stand-in's
    storage: module names may differ from published ones; quantize_model then keeps them and ties a
    tied head to the embedding's rows). Returns {(kernel, GGUF type): block linears}, and
    {("embedding" / "head", GGUF type): 1} for the ends."""
    from ..models.cpu_int4 import Int4Linear
    from ..models.cpu_quant import Int8Embedding, Int8Linear

    by_storage = {weights[name].data_ptr(): name for name in codes}
    placed = Counter()
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) not in (nn.Linear, nn.Embedding) or (name := by_storage.get(child.weight.data_ptr())) is None:
                continue
            kernel, qtype, held = codes.pop(name)
            end = "embedding" if type(child) is nn.Embedding else "head" if child is model.output_head else None
            if end == "embedding":
                new = Int8Embedding(child, dtype, codes=held)
            elif kernel == "int8":
                new = Int8Linear(child, dtype, head=end == "head", codes=held)
            else:
                new = Int4Linear(child, dtype, buffers=held)
            setattr(module, child_name, new)
            placed[end or kernel, qtype] += 1
    if codes:
        raise ValueError(f"quantized codes with no linear to hold them: {', '.join(sorted(codes)[:3])}")
    return placed
