"""A GGUF file as llama.cpp's converter writes it (docs/specs/gguf.md): its metadata read into the published
config.json of the family, its tensors renamed to the published names, q/k rows put back in the
published order, and dequantized to the compute dtype. Every refusal (an architecture, a tensor type,
a missing key, a file that is not GGUF) is one line, raised before any weight is read."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from .gguf_arch import Arch, arch_of, check_common, decimal, dream_config, llada_moe_config, rnd1_config, specials

FLOATS = ("F32", "F16", "BF16")
# kept quantized on a CPU (gguf_int8.py, gguf_int4.py). Q4_1 / Q5_0 / Q5_1 are what llama-quantize writes
# where a row is not a multiple of 256 (its tensor_type_fallback: Q4_K -> Q5_0, Q5_K -> Q5_1; Q4_1 in
# a Q4_0 file's first ffn_down layers with an imatrix), so a Q4_K_M file of a small model holds them
QUANTIZED = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
READS = FLOATS + QUANTIZED                                # the tensor types fastdllm takes (docs/specs/gguf.md 4)
DEQUANTIZED = QUANTIZED                                   # into the compute dtype where not kept quantized
FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")                       # int4 by default on a CPU (gguf_int4.py)
CHUNK = 1 << 22              # values dequantized at a time: 16 MiB of float32 and the package's temporaries


def gguf_module():
    try:
        import gguf
    except ImportError:
        raise UserError("reading GGUF files needs the gguf package: pip install 'fastdllm[gguf]'") from None
    return gguf


@dataclass
class GGUFTensor:
    name: str                  # the published name (model.transformer.blocks.0.q_proj.weight)
    gguf_name: str             # llama.cpp's (blk.0.attn_q.weight)
    type: str                  # F32, F16, BF16, Q8_0
    shape: tuple[int, ...]     # torch order: (out_features, in_features)
    n_bytes: int
    raw: object                # the reader's memory-mapped view of the file's bytes
    offset: int = 0            # where those bytes start in the file


class GGUFFile:
    """The file's metadata and tensor table as the gguf package reads them (open_checked refuses
    what fastdllm cannot run)."""

    def __init__(self, path: Path):
        gguf = gguf_module()
        self.path = Path(path)
        with open(self.path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                raise UserError(f"{self.path.name} is not a GGUF file (it does not start with the bytes GGUF)")
        try:
            self.reader = gguf.GGUFReader(self.path)
        except Exception as e:   # truncated header or tensor data, an unknown version: numpy's or the reader's words
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UserError(f"{self.path.name} is truncated or damaged; the gguf package cannot read it ({reason})") from None
        self.arch = self.value("general.architecture")

    def value(self, key: str, default=None):
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str, read: bool = True):
        """The key's value (`read=False`: only its presence, for the 100k-entry vocabulary arrays)."""
        if key not in self.reader.fields:
            raise UserError(f"{self.path.name} lacks the GGUF key {key}, which decoding needs")
        return self.value(key) if read else None

    def hparam(self, key: str, default=None):
        """`{arch}.key`: llama.cpp's per-architecture hyperparameters (llada.block_count, ...)."""
        return self.value(f"{self.arch}.{key}", default)

    def tensors(self, arch: Arch) -> list[GGUFTensor]:
        out = []
        for t in self.reader.tensors:
            kind = t.tensor_type.name
            published = arch.published(t.name)
            # the reader lists dims fastest-first (ne0 = in_features); torch's order is the reverse
            shape = tuple(int(n) for n in reversed(t.shape.tolist()))
            if t.data.nbytes != t.n_bytes:
                raise UserError(f"{self.path.name} is truncated: tensor {t.name} has {t.data.nbytes} of its {t.n_bytes} bytes")
            if published is None:
                raise UserError(f"{self.path.name}: tensor {t.name} has no place in fastdllm's {self.arch} "
                                f"(its known tensors: {arch.known()})")
            out.append(GGUFTensor(published, t.name, kind, shape, int(t.n_bytes), t.data, int(t.data_offset)))
        return out


def release(f: GGUFFile, t: GGUFTensor) -> None:
    """Drop the pages of `t`'s bytes from this process's resident memory once they are read (the
    kernel's page cache keeps them; touching them again reads them back): loading then holds the
    model being built plus one tensor of the file, not the whole file as well."""
    import mmap

    mapped = getattr(f.reader.data, "_mmap", None)         # numpy.memmap's own mmap object
    if mapped is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = t.offset // mmap.PAGESIZE * mmap.PAGESIZE
    try:
        mapped.madvise(mmap.MADV_DONTNEED, start, t.offset + t.n_bytes - start)
    except (OSError, ValueError):          # not supported here: the pages stay until the reader goes
        pass


def open_checked(path: Path) -> tuple[GGUFFile, list[GGUFTensor]]:
    """The file and its tensor table, or the one-line refusal: architecture, tensor types, names."""
    f = GGUFFile(path)
    if f.arch is None:
        raise UserError(f"{f.path.name} has no general.architecture: not a model file")
    if (parts := f.value("split.count", 1)) > 1:         # llama.cpp's gguf-split: the tensors are in N files
        raise UserError(f"{f.path.name} is one of {parts} parts of a split GGUF file; fastdllm reads whole files "
                        "so far (llama.cpp's gguf-split --merge joins them)")
    arch = arch_of(f)
    types = Counter()
    first = {}
    for t in f.reader.tensors:
        types[t.tensor_type.name] += 1
        first.setdefault(t.tensor_type.name, t.name)
    refused = sorted(k for k in types if k not in READS)
    if refused:
        raise UserError(f"{f.path.name} holds {', '.join(refused)} tensors (e.g. {first[refused[0]]}); fastdllm reads "
                        f"GGUF tensors of types {', '.join(READS)} so far")
    return f, f.tensors(arch)


def config_for(f: GGUFFile, tensors: list[GGUFTensor]) -> dict:
    """The family's published config.json from the metadata llama.cpp's converter writes (docs/specs/gguf.md)."""
    arch = arch_of(f)
    by_name = {t.name: t for t in tensors}
    build = {"llada": llada_config, "dream": dream_config, "rnd1": rnd1_config, "llada-moe": llada_moe_config}[arch.name]
    return build(f, arch, by_name)


def llada_config(f: GGUFFile, arch: Arch, by_name: dict) -> dict:
    """LLaDA's published config.json (docs/specs/gguf.md section 2)."""
    n_heads = int(f.require("llada.attention.head_count"))
    d_model = int(f.require("llada.embedding_length"))
    if d_model % n_heads:
        raise UserError(f"{f.path.name}: llada.embedding_length {d_model} is not a multiple of the {n_heads} heads")
    check_common(f, arch, d_model // n_heads)
    n_kv = f.hparam("attention.head_count_kv", n_heads)
    embed = by_name.get("model.transformer.wte.weight")
    if embed is None:
        raise UserError(f"{f.path.name} has no token_embd.weight tensor")
    return {"architectures": ["LLaDAModelLM"], "model_type": "llada",
            "d_model": d_model, "n_heads": n_heads, "n_kv_heads": int(n_kv),
            "n_layers": int(f.require("llada.block_count")),
            "mlp_hidden_size": int(f.require("llada.feed_forward_length")),
            "vocab_size": int(f.hparam("vocab_size", embed.shape[0])), "embedding_size": embed.shape[0],
            "max_sequence_length": int(f.require("llada.context_length")),
            "rope_theta": decimal(f.hparam("rope.freq_base", 10000.0)),     # llama.cpp's default where absent
            "rms_norm_eps": decimal(f.require("llada.attention.layer_norm_rms_epsilon")), **specials(f),
            "weight_tying": "model.transformer.ff_out.weight" not in by_name,     # llama.cpp: output = token_embd
            "include_qkv_bias": "model.transformer.blocks.0.q_proj.bias" in by_name,
            "include_bias": False, "block_type": "llama", "activation_type": "silu", "layer_norm_type": "rms",
            "rope": True, "alibi": False, "attention_layer_norm": False, "scale_logits": False,
            "input_emb_norm": False, "torch_dtype": "float32"}


def unpermute_rows(w, n_heads: int):
    """Undo the converter's q/k permutation: per head, llama.cpp keeps rotary pairs interleaved
    (rows 2i, 2i+1 of a head) where LLaDA's checkpoint has them in halves (rows i, i + hd/2).
    w: (n_heads * hd, ...) -> the same shape, each head's rows back in halves."""
    hd = w.shape[0] // n_heads
    return w.reshape(n_heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def state_dict(path: Path, config: dict, dtype) -> dict:
    """The published-name state dict in `dtype`: F32/F16/BF16 converted, the quantized types
    dequantized by the gguf package (its own dequantize, float32, then `dtype`), permuted rows put
    back, stacked experts (E, out, in) split into the published per-expert tensors."""
    f, tensors = open_checked(path)
    arch = arch_of(f)
    out = {}
    for t in tensors:
        array = dequantized(t, arch, config, dtype)
        if "{e}" in t.name:
            out.update({t.name.format(e=e): array[e] for e in range(array.shape[0])})
        else:
            out[t.name] = array
        release(f, t)
    return out


def row_chunks(t: GGUFTensor):
    """(first row, float32 numpy (rows, K)) over the tensor's rows in the file's order (experts
    stacked: E * out rows), CHUNK values at a time: the gguf package's dequantization (float32, as
    llama.cpp's own dequantize_row_*; docs/specs/gguf.md 4) never holds more than a chunk and its temporaries."""
    import numpy as np

    gguf = gguf_module()
    kind = gguf.GGMLQuantizationType[t.type]
    raw = t.raw.reshape(-1, t.raw.shape[-1])                 # (R, bytes or values of a row)
    step = max(1, CHUNK // t.shape[-1])
    for i in range(0, raw.shape[0], step):                   # a copy: the reader maps the file read-only
        yield i, np.array(gguf.quants.dequantize(raw[i:i + step], kind), dtype=np.float32)


def dequantized(t: GGUFTensor, arch: Arch, config: dict, dtype):
    """One tensor as a torch tensor in `dtype`, torch's shape, the published row order."""
    import torch

    out = torch.empty((math.prod(t.shape[:-1]), t.shape[-1]), dtype=dtype)
    for i, rows in row_chunks(t):
        out[i:i + len(rows)] = torch.from_numpy(rows)
    out = out.view(t.shape)
    module = t.name.rsplit(".", 2)[-2]
    if module in arch.permuted:
        out = unpermute_rows(out, config[arch.permuted[module]]).contiguous()
    return out


def summary(tensors: list[GGUFTensor]) -> dict:
    """What `info` shows of the file: types by element count, bytes, and what loading does to them."""
    counts = Counter()
    for t in tensors:
        n = 1
        for s in t.shape:
            n *= s
        counts[t.type] += n
    types = [k for k, _ in counts.most_common()]
    dequantized = ", ".join(k for k in types if k in DEQUANTIZED)
    four_bit = [k for k in types if k in FOUR_BIT]
    if four_bit:         # gguf_int4.py: kept quantized on a CPU by default
        rest = [k for k in types if k in QUANTIZED and k not in four_bit]
        how = (f"; on a CPU {', '.join(four_bit)} kept as int4" + (f" and {', '.join(rest)} as int8 rows" if rest else "")
               + f", re-quantized (docs/specs/gguf.md 11; --quantize int8: all int8 rows); on a GPU {dequantized} "
               "dequantized to the compute dtype")
    else:
        how = (f"; {dequantized} dequantized to the compute dtype at load; --quantize int8: {dequantized} "
               "re-quantized per row into int8 straight from the file (one more rounding, docs/specs/gguf.md 10)"
               ) if dequantized else ""
    return {"dtype_on_disk": f"{', '.join(k.lower() for k in types)} (GGUF{how})", "types": types,
            "bytes_on_disk": sum(t.n_bytes for t in tensors)}
