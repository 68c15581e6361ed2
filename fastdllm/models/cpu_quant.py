"""int8 / int4 for CPUs on torch's own matmuls (docs/cpu-quantization.md).

int8: per-output-channel symmetric, w = q * scale, q in [-127, 127], one scale per row;
`torch._weight_int8pack_mm(x (M, K), q (N, K) int8, scale (N,))` (weight-only) under W8A8_ROWS rows;
from W8A8_ROWS rows the activations are quantized too, per row, and `torch._int_mm` sums int8 x int8
in int32 (W8A8, where `_int_mm` is exact: int_mm_exact).
int4: asymmetric groups of GROUP_SIZE along K, w = (q - 8) * scale + zero, q in [0, 15], the float
zero at the middle of the group's range; `torch._weight_int4pack_mm_for_cpu(x, packed, group,
scales_and_zeros (K/group, N, 2))`, the weight packed once by `_convert_weight_to_int4pack_for_cpu`.

Both kernels take bf16, fp16 or fp32 activations and accumulate in fp32, but only bf16 has fast
paths (fp32 runs a reference loop, 10-100x slower; measured in the doc): the quantized model
computes in bf16. Scales and zeros are kept in the activation dtype, as the kernels read them, and
the codes are computed from those rounded scales, so `dequantized()` is exactly what the kernel
multiplies by. Quantized linears are for inference only (buffers, no gradients)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FORMATS = ("int8", "int4")
GROUP_SIZE = 64          # int4 group along K: the doc's choice (speed, accuracy)


def quantize_int8(w: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """w (N, K) float -> (q (N, K) int8, scale (N,) in `dtype`): symmetric per row."""
    w = w.detach().float()
    scale = (w.abs().amax(1) / 127).clamp_min(1e-12).to(dtype)          # rounded as stored
    q = torch.round(w / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(w: torch.Tensor, group: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """w (N, K) float -> (q (N, K) int32 in [0, 15], scales_and_zeros (K/group, N, 2) in `dtype`)."""
    N, K = w.shape
    g = w.detach().float().view(N, K // group, group)
    lo, hi = g.amin(-1), g.amax(-1)                                      # (N, K/group)
    scale = ((hi - lo) / 15).clamp_min(1e-12).to(dtype)
    zero = (lo + 8 * scale.float()).to(dtype)                           # the value of code 8
    s, z = scale.float()[..., None], zero.float()[..., None]
    q = torch.round((g - z) / s + 8).clamp_(0, 15).to(torch.int32).view(N, K)
    return q, torch.stack([scale.T, zero.T], -1).contiguous()


def dequantize_int4(q: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> torch.Tensor:
    """The float weight (N, K) fp32 that codes q (N, K) stand for."""
    N, K = q.shape
    sz = scales_and_zeros.float()                                        # (K/group, N, 2)
    scale, zero = sz[..., 0].T[..., None], sz[..., 1].T[..., None]      # (N, K/group, 1)
    return ((q.view(N, K // group, group).float() - 8) * scale + zero).view(N, K)


class QuantLinear(nn.Module):
    """What both formats share: (in, out) sizes, the bias, the 2-D reshape around the kernel. The
    packed weight is a buffer named `weight` (layers.linear reads `weight.is_mkldnn`)."""

    def __init__(self, lin: nn.Linear, dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = lin.weight.shape            # a fused linear's rows: the group's
        self.dtype = dtype
        bias = None if lin.bias is None else lin.bias.detach().to(dtype)
        self.register_buffer("bias", bias)
        if hasattr(lin, "fused_sizes"):                                  # q/k/v or gate/up in one matrix
            self.fused_sizes = lin.fused_sizes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = self.matmul(x.reshape(-1, self.in_features).to(self.dtype).contiguous())   # (M, N)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.dtype}"


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations x (M, K) -> (q (M, K) int8, scale (M,) fp32): symmetric per row, dynamic,
    s = max|x_row| / 127, q = round(x / s) (half to even) clamped to [-127, 127], all in fp32."""
    x = x.to(torch.float32, copy=True)                                 # modified in place below
    scale = x.abs().amax(1).div_(127).clamp_min_(1e-30)                # an all-zero row: codes 0
    q = x.div_(scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    return q, scale


_INT_MM_EXACT: bool | None = None


def int_mm_exact() -> bool:
    """Whether `torch._int_mm` (s8 x s8 -> s32, oneDNN) sums exactly on this machine; checked once.
    With VNNI (AVX-512 VNNI, AVX-VNNI) it does. Without (AVX2, AVX-512 before VNNI, or oneDNN held
    to AVX2 by ONEDNN_MAX_CPU_ISA=AVX2) oneDNN's int8 kernels add u8 x s8 pairs in saturating int16
    (vpmaddubsw) and are wrong by up to the whole value (docs/cpu-quantization.md): the probe, rows
    of +127, -127 and random codes, saturates there; where it does, Int8Linear stays weight-only."""
    global _INT_MM_EXACT
    if _INT_MM_EXACT is None:
        g = torch.Generator().manual_seed(0)
        a = torch.randint(-127, 128, (16, 512), generator=g, dtype=torch.int8)
        a[0], a[1] = 127, -127
        b = torch.randint(-127, 128, (48, 512), generator=g, dtype=torch.int8)
        b[0] = 127
        try:
            _INT_MM_EXACT = torch.equal(torch._int_mm(a, b.t()).long(), a.long() @ b.long().t())
        except RuntimeError:
            _INT_MM_EXACT = False
    return _INT_MM_EXACT


# From this many rows (M of the flattened (M, K) input) Int8Linear quantizes its activations too and
# runs int8 x int8 (`torch._int_mm`); below, the weight-only kernel (docs/cpu-quantization.md, 1).
# None: weight-only at every M. Only where `_int_mm` is exact (int_mm_exact).
W8A8_ROWS: int | None = 16


def w8a8_rows() -> int | None:
    return W8A8_ROWS if W8A8_ROWS is not None and int_mm_exact() else None


class Int8Linear(QuantLinear):
    """int8 weights; activations bf16 (weight-only, `_weight_int8pack_mm`) under `w8a8_rows` rows,
    int8 per row (dynamic, `quantize_rows`) from `w8a8_rows` on: y = (q_x @ q_w.T) * s_x s_w, the
    int8 sum accumulated exactly in int32 by `torch._int_mm`, rescaled in fp32, rounded to the
    activation dtype once, + bias."""
    fmt = "int8"
    w8a8_rows: int | None = None                                     # set at build: w8a8_rows()

    def __init__(self, lin: nn.Linear, dtype: torch.dtype):
        super().__init__(lin, dtype)
        q, scale = quantize_int8(lin.weight, dtype)
        self.register_buffer("weight", q)                                # (N, K) int8
        self.register_buffer("scales", scale)                            # (N,)
        self.w8a8_rows = w8a8_rows()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.w8a8_rows is not None and x.shape[0] >= self.w8a8_rows:
            return self.matmul_w8a8(x)
        return torch._weight_int8pack_mm(x, self.weight, self.scales)

    def matmul_w8a8(self, x: torch.Tensor) -> torch.Tensor:
        q, scale = quantize_rows(x)
        acc = torch._int_mm(q, self.weight.t())                          # (M, K) @ (K, N) view: int32
        return acc.float().mul_(scale[:, None]).mul_(self.scales.float()).to(x.dtype)

    def dequantized(self) -> torch.Tensor:
        return self.weight.float() * self.scales.float()[:, None]


class Int4Linear(QuantLinear):
    fmt = "int4"

    def __init__(self, lin: nn.Linear, dtype: torch.dtype, group: int | None = None):
        super().__init__(lin, dtype)
        group = group or int4_group(self.in_features)
        q, sz = quantize_int4(lin.weight, group, dtype)
        self.group = group
        self.register_buffer("weight", torch._convert_weight_to_int4pack_for_cpu(q, 1))   # (N, K/2) uint8
        self.register_buffer("scales_and_zeros", sz)                     # (K/group, N, 2)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x, self.weight, self.group, self.scales_and_zeros)

    def dequantized(self) -> torch.Tensor:
        """Read back through the kernel itself: identity rows (fp32, one product each: exact)."""
        eye = torch.eye(self.in_features, dtype=torch.float32)
        return torch._weight_int4pack_mm_for_cpu(eye, self.weight, self.group,
                                                 self.scales_and_zeros.float()).T.contiguous()


class Int8Embedding(nn.Module):
    """An embedding as int8 rows with a scale each, dequantized on gather (ids -> (.., d) in
    `dtype`). `qweight`/`scales` are an Int8Linear's weight and scales: a tied head shares them
    (`as_head`). `weight` is an empty parameter in the compute dtype, for the code that reads the
    model's dtype and device from the embedding (base.new_cache, base._execution_device)."""

    def __init__(self, emb: nn.Embedding, dtype: torch.dtype):
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.dtype = emb.num_embeddings, emb.embedding_dim, dtype
        q, scale = quantize_int8(emb.weight, dtype)
        self.register_buffer("qweight", q)                               # (V, d) int8
        self.register_buffer("scales", scale)                            # (V,)
        self.weight = nn.Parameter(torch.empty(0, dtype=dtype, device=q.device), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.qweight).to(self.dtype) * self.scales[ids, None]   # (.., d)

    def dequantized(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]

    def as_head(self) -> nn.Module:
        """An Int8Linear over these very tensors (no copy): the tied output head."""
        head = Int8Linear.__new__(Int8Linear)
        nn.Module.__init__(head)
        head.in_features, head.out_features, head.dtype = self.embedding_dim, self.num_embeddings, self.dtype
        head.register_buffer("bias", None)
        head.weight, head.scales = self.qweight, self.scales
        head.w8a8_rows = w8a8_rows()
        return head


def int4_group(K: int) -> int | None:
    """GROUP_SIZE where it divides K, else 32 (small test models), else None."""
    return next((g for g in (GROUP_SIZE, 32) if K % g == 0), None)


def fits(fmt: str, lin: nn.Module) -> bool:
    """Whether the kernel takes this weight (N, K): int4 packs N in 16-row panels and K in groups;
    a linear emptied by fusion (its rows live in the first of its group) has nothing to quantize."""
    N, K = lin.weight.shape
    if lin.weight.numel() == 0 or lin.weight.device.type != "cpu":
        return False
    return fmt == "int8" or (N % 16 == 0 and int4_group(K) is not None)


def quantize_model(model: nn.Module, fmt: str, dtype: torch.dtype, *, head: bool | None = None,
                   embedding: bool = False, skip: tuple[str, ...] = ()) -> dict:
    """Replace `model`'s block linears (after `prepare_for_inference`, which fuses q/k/v and
    gate/up) with Int8Linear / Int4Linear in place. `head`: the output head too (None: where it
    pays, see HEAD_PAYS); `embedding`: the input embedding as int8 rows, shared with a tied head.
    `skip`: module-name suffixes kept in float (a family's router). Returns counts for the report."""
    make = {"int8": Int8Linear, "int4": Int4Linear}[fmt]
    head = HEAD_PAYS[fmt] if head is None else head
    done = {"linears": 0, "kept": 0}
    for block in model.blocks:
        for name, module in list(block.named_modules()):
            for child_name, child in list(module.named_children()):
                full = f"{name}.{child_name}".lstrip(".")
                if type(child) is not nn.Linear or full.endswith(skip) or child.weight.numel() == 0:
                    continue
                if fits(fmt, child):
                    setattr(module, child_name, make(child, dtype))
                    done["linears"] += 1
                else:
                    done["kept"] += 1
    out = model.output_head
    if out is None and head:             # tied: one int8 matrix is both the embedding and the head
        emb = Int8Embedding(model.embed, dtype)
        _replace(model, model.embed, emb)
        _set_head(model, emb.as_head())
        done.update(embedding="int8", head="int8 (tied: the embedding's rows)")
    elif out is not None and head and fits(fmt, out):
        _set_head(model, make(out, dtype))
        done["head"] = fmt
    # a tied embedding stays float under a float head (an int8 embedding would need a float copy)
    if embedding and out is not None and isinstance(model.embed, nn.Embedding):
        _replace(model, model.embed, Int8Embedding(model.embed, dtype))
        done["embedding"] = "int8"
    model.is_quantized = True            # decode/graphs.py: no CUDA graphs
    model.cpu_quantized = fmt
    return done


# Whether the output head is quantized by default, per format: not, as measured at vocab 152k
# (docs/cpu-quantization.md): a step's head sees 8-32 rows, where both weight-only kernels are 2-5x
# slower than bf16; only a single row (M = 1) is faster in int4. (An int8 head now runs W8A8 from 16
# rows, at par with bf16 at 32 rows in the block linears: not re-measured at the head's shape.)
HEAD_PAYS = {"int8": False, "int4": False}


def _replace(root: nn.Module, old: nn.Module, new: nn.Module) -> None:
    for module in root.modules():
        for name, child in module.named_children():
            if child is old:
                setattr(module, name, new)
                return
    raise ValueError(f"{type(old).__name__} not found in the model")


def _set_head(model: nn.Module, head: nn.Module) -> None:
    """In place of the family's head module (`lm_head`, LLaDA's `ff_out`), or where the family
    looks for one when tied (DecoderStack: `lm_head`; LLaDA: `model.transformer.ff_out`)."""
    if model.output_head is not None:
        _replace(model, model.output_head, head)
    elif hasattr(getattr(model, "model", None), "transformer"):
        model.model.transformer.ff_out = head
    else:
        model.lm_head = head
    if model.output_head is not head:
        raise ValueError(f"{type(model).__name__}: cannot place a quantized output head")
