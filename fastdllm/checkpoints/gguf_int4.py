"""The 4-bit GGUF types kept quantized on the CPU (docs/specs/gguf.md 11): Q4_0, Q4_1 and Q4_K into
fastdllm's int4 kernels (models/cpu_int4.py), and the types llama.cpp's Q4_K_M / Q4_K_S mix them with
(Q6_K, Q5_K, and the fallbacks Q5_0 / Q5_1 of rows not a multiple of 256) into int8 rows, by
gguf_int8.py's mechanism (one tensor at a time, no float copy of the model).

No 4-bit type fits fastdllm's int4 layout exactly: the groups (32 values along a row) and the
codes (-8..7) agree with Q4_0's, but fastdllm's step is a 4-bit multiplier times a power of two per
row (so that W4A8 multiplies int8 codes) where Q4_0 has a free fp16 scale per block, and Q4_1's
blocks and Q4_K's sub-blocks carry an offset that a symmetric format has no place for. So all are
re-quantized by quantize_int4 from the gguf package's float32 dequantization (section 11 has the
measured error).

When: `--quantize int4`, and by default (`--quantize none`) for a file holding Q4_0 / Q4_1 / Q4_K tensors on
a CPU with `--dtype auto` or `bf16` (a 4-bit file is picked to be small; dequantizing it would hold
the model at 4x its size). `--dtype fp32` / `fp64` or a GPU dequantize it instead."""

from __future__ import annotations

from collections import Counter

from .gguf_file import FOUR_BIT, GGUFTensor
from .gguf_int8 import KernelFor, int8_kernels

# into int8 rows: int4 would add about 8.6% (relative rms) to their 1.9% / 3.8% / 3.0-3.8% (section 11);
# Q5_0 / Q5_1 are llama-quantize's stand-ins for Q4_K / Q5_K in rows not a multiple of 256
COMPANIONS = ("Q6_K", "Q5_K", "Q5_0", "Q5_1")
GROUP = 32                      # fastdllm's int4 group (models/cpu_int4.GROUP), along a row


def int4_kernels(t: GGUFTensor, *, four_bit_file: bool = False) -> str | None:
    """--quantize int4: Q4_0 / Q4_1 / Q4_K (and a Q8_0 file's tensors, asked to be int4) into int4 where
    the kernel takes the shape (out a multiple of 16: its packing), else int8 rows; Q6_K / Q5_K / Q5_0 /
    Q5_1 into int8 rows (section 11: int4 would lose most of what they keep over Q4_K), and so Q8_0 in
    a file that holds 4-bit types (`four_bit_file`: there it is llama-quantize's stand-in for Q6_K)."""
    if t.type in FOUR_BIT or (t.type == "Q8_0" and not four_bit_file):
        out, k = t.shape[-2:]
        return "int4" if out % 16 == 0 and k % GROUP == 0 else "int8"
    return "int8" if t.type in COMPANIONS + ("Q8_0",) else None


def kernels_for(quantize: str, types=()) -> KernelFor | None:
    """Which kernel each tensor of a GGUF file holding tensors of `types` goes to under `--quantize`
    (None: no kept path)."""
    if quantize == "int4":
        four_bit_file = any(k in FOUR_BIT for k in types)
        return lambda t: int4_kernels(t, four_bit_file=four_bit_file)
    return {"int8": int8_kernels}.get(quantize)


def default_quantize(source: dict, quantize: str, device: str, dtype: str) -> tuple[str, str | None]:
    """(the --quantize a GGUF file loads with, the note saying why, or None): `int4` in place of
    `none` for a file holding Q4_0 / Q4_1 / Q4_K on a CPU in bf16 (the module docstring); else `quantize`."""
    four_bit = [k for k in source.get("types", ()) if k in FOUR_BIT]
    if quantize != "none" or not four_bit or dtype not in ("auto", "bf16") or device not in ("auto", "cpu"):
        return quantize, None
    if device == "auto":
        import torch

        if torch.cuda.is_available():      # a GPU: dequantized to bf16 (the int4 kernels are CPU kernels)
            return quantize, None
    return "int4", (f"{', '.join(four_bit)} tensors kept quantized: loaded as --quantize int4 (re-quantized, "
                    "docs/specs/gguf.md 11); --dtype fp32 dequantizes them instead")


def describe_kept(placed: Counter, quantize: str) -> str:
    """What the kept linears (and the embedding and head taken from the file) are, for `info` / the
    run's model record."""
    ends = [f"{kind} ({t})" for (kind, t) in placed if kind in ("embedding", "head")]
    placed = Counter({key: n for key, n in placed.items() if key[0] in ("int8", "int4")})
    total = sum(placed.values())
    also = f"; the {' and '.join(ends)} into int8 rows from the file" if ends else ""
    if all(kernel == "int8" for kernel, _ in placed):
        types = ", ".join(dict.fromkeys(t for _, t in placed))
        return (f"{total} block linears from {types} re-quantized per row{also} "
                f"(docs/specs/gguf.md {10 if quantize == 'int8' else 11})")
    parts = [f"{n} from {t} into {'int4' if kernel == 'int4' else 'int8 rows'}" for (kernel, t), n in placed.items()]
    return f"{total} block linears: {', '.join(parts)}{also}, re-quantized (docs/specs/gguf.md 11)"
