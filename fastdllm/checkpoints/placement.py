"""Where and how a model is placed: --dtype, --device, --quantize (not decoding settings: they
choose what is loaded, before any profile). Torch is imported only where a placement is made, so
that flags are checked without it."""

from __future__ import annotations

import logging
import re

from ..errors import UserError

PLACEMENT_CHOICES = {"dtype": ("auto", "bf16", "fp16", "fp32", "fp64"),
                     "device": ("auto", "cpu", "cuda", "cuda:N", "mps"),
                     "quantize": ("none", "int8", "int4", "8bit", "4bit")}
CPU_FORMATS = ("int8", "int4")          # weight-only, torch's CPU kernels (models/cpu_quant.py)


def placement_error(key: str, value: str) -> str | None:
    """Why `value` is not a valid --dtype / --device / --quantize, or None when it is."""
    choices = PLACEMENT_CHOICES[key]
    if value in choices or (key == "device" and re.fullmatch(r"cuda:\d+", value)):
        return None
    return f"unknown {key} {value!r} (expected one of {', '.join(choices)})"


def torch_placement(dtype: str, device: str, quantize: str = "none"):
    """--dtype / --device -> (torch dtype, accelerate device_map, why auto chose that dtype or None).
    int8 / int4 compute in bf16 by default (their kernels' fast path; fp32 activations take a
    reference loop); plain weights on a CPU follow the CPU (cpu_dtype.py)."""
    import torch

    cuda = torch.cuda.is_available()
    if device == "auto":
        device_map = "auto" if cuda else {"": "cpu"}   # "auto": accelerate spreads over GPUs, offloads to CPU
    elif device.startswith("cuda") and not cuda:
        raise UserError(f"--device {device}: no CUDA device is available (torch {torch.__version__})")
    else:
        device_map = {"": device}
    on_gpu = device_map == "auto" or not str(device_map[""]).startswith("cpu")
    if quantize in CPU_FORMATS:
        cpu_quant_check(quantize, dtype, device_map)
        if dtype == "auto":
            return torch.bfloat16, device_map, f"bf16: the {quantize} kernels' fast path"
    if dtype == "auto" and on_gpu:
        return torch.bfloat16, device_map, "bf16: GPU"
    if dtype == "auto" and quantize != "none":       # bitsandbytes on a CPU: as before, fp32
        return torch.float32, device_map, None
    why = None
    if dtype == "auto":
        from .cpu_dtype import auto_choice

        choice = auto_choice()
        dtype, why = choice.dtype, choice.reason
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}[dtype], \
        device_map, why


def cpu_quant_check(quantize: str, dtype: str, device_map) -> None:
    """int8 / int4 run on the CPU and compute in bf16 or fp32: one-line errors otherwise."""
    on_cpu = device_map != "auto" and str(device_map[""]).startswith("cpu")
    if not on_cpu:
        where = "a GPU" if device_map == "auto" else f"--device {device_map['']}"
        raise UserError(f"--quantize {quantize} has CPU kernels only, not for {where}: use --quantize "
                        f"{'8bit' if quantize == 'int8' else '4bit'} (bitsandbytes) there, or --device cpu")
    if dtype not in ("auto", "bf16", "fp32"):
        raise UserError(f"--quantize {quantize} computes in bf16 (default) or fp32, not --dtype {dtype}")


def bf16_load_note(loaded) -> str | None:
    """Said when a model (loading.LoadedModel) is loaded on a CPU in bf16 where fp32 is the faster
    format (what cpu_dtype.decide says here, whatever FASTDLLM_CPU_DTYPE pins): what --dtype auto
    picks and why. None elsewhere: on a GPU, in another dtype, where bf16 is right, and for int8 /
    int4, which compute in bf16 on purpose (their kernels' fast path)."""
    if not loaded.info.get("bf16") or loaded.quantize in CPU_FORMATS:    # info's "bf16": a CPU load in bf16
        return None
    from .cpu_dtype import decided

    choice = decided()
    return None if choice.dtype == "bf16" else f"bf16 is slower than fp32 on this CPU; --dtype auto picks {choice.reason}"


BNB_ON_CPU_NOTE = ("bitsandbytes 8bit/4bit compute slower than fp32 on a CPU: --quantize int8 / int4 are "
                   "the CPU formats (docs/specs/cpu-quantization.md)")


def quantization_config(quantize: str, compute_dtype, skip: tuple[str, ...] | None = None):
    """--quantize 8bit / 4bit -> transformers' BitsAndBytesConfig (nf4, computing in the model dtype).
    `skip`: module names kept unquantized (a family's router); None: transformers' default choice."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise UserError(f"--quantize {quantize} needs bitsandbytes: pip install 'fastdllm[quant]'") from None
    from transformers import BitsAndBytesConfig

    if quantize == "8bit":
        # bitsandbytes logs on every 8-bit matmul that it computes in fp16: said once, here
        logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=list(skip) if skip else None)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=compute_dtype, bnb_4bit_quant_type="nf4",
                              llm_int8_skip_modules=list(skip) if skip else None)
