"""What this CPU can do, asked of torch at run time (never assumed from the build machine).

oneDNN's bf16 kernels need AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT; elsewhere torch still computes
bf16, element by element in fp32 ("emulated": correct but slow). Both oneDNN and ATen honour
`ONEDNN_MAX_CPU_ISA` / `ATEN_CPU_CAPABILITY`, so the answers below follow those limits too.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def capability() -> str:
    """The vector ISA ATen dispatches to: DEFAULT, AVX2, AVX512, ZVECTOR ..."""
    return torch.backends.cpu.get_cpu_capability()


@functools.cache
def bf16_native() -> bool:
    """True when oneDNN has bf16 kernels on this CPU (under its ISA limit)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(torch.backends.mkldnn.is_available() and check is not None and check())


def packable_dtypes() -> frozenset[torch.dtype]:
    """The weight dtypes that oneDNN can keep in its blocked layout here (see layers.pack_linear)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return frozenset()
    return frozenset({torch.float32, torch.bfloat16} if bf16_native() else {torch.float32})


def bf16_note() -> str:
    """Said wherever a CPU bf16 run is described: whether bf16 has native kernels here."""
    if bf16_native():
        return "bf16 native"
    return "bf16 emulated (no AVX-512 bf16 units): slow, fp32 (what --dtype auto picks here) is faster"


def this_cpu() -> dict:
    return {"capability": capability(), "bf16_native": bf16_native()}
