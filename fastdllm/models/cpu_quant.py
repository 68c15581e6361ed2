"""int8 for CPUs on torch's own matmuls, and the conversion of a model to int8 or int4
(docs/specs/cpu-quantization.md; int4's format: cpu_int4.py; what both share: cpu_kernels.py).

int8: per-output-channel symmetric, w = q * scale, q in [-127, 127], one scale per row;
`torch._weight_int8pack_mm(x (M, K), q (N, K) int8, scale (N,))` (weight-only) under `w8a8_rows()`
rows; from there on the activations are quantized too, per row, and `torch._int_mm` sums int8 x
int8 in int32 (W8A8, where `_int_mm` is exact: int_mm_exact).

The weight-only kernels take bf16, fp16 or fp32 activations and accumulate in fp32, but only bf16
has fast paths (fp32 runs a reference loop, 10-100x slower; measured in the doc): the quantized
model computes in bf16. Scales are kept in the activation dtype, as the kernels read them, and the
codes are computed from those rounded scales, so `dequantized()` is exactly what the kernel
multiplies by. Quantized linears are for inference only (buffers, no gradients)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .cpu_int4 import GROUP as INT4_GROUP
from .cpu_int4 import Int4Linear
from .cpu_kernels import QuantLinear, int8_matmul, w8a8_rows

FORMATS = ("int8", "int4")


def quantize_int8(w: torch.Tensor, dtype: torch.dtype, rows: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """w (N, K) float -> (q (N, K) int8, scale (N,) in `dtype`): symmetric per row, `rows` rows at a
    time (a 152k-row embedding's float32 temporaries would be several times its size)."""
    if w.shape[0] > rows:
        parts = [quantize_int8(w[i:i + rows], dtype, rows) for i in range(0, w.shape[0], rows)]
        return torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])
    w = w.detach().float()
    scale = (w.abs().amax(1) / 127).clamp_min(1e-12).to(dtype)          # rounded as stored
    q = torch.round(w / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(QuantLinear):
    """int8 weights; activations bf16 (weight-only, `_weight_int8pack_mm`) under `w8a8_rows` rows,
    int8 per row (dynamic, `quantize_rows`) from `w8a8_rows` on: y = (q_x @ q_w.T) * s_x s_w, the
    int8 sum accumulated exactly in int32 by `torch._int_mm`, rescaled in fp32, rounded to the
    activation dtype once, + bias."""
    fmt = "int8"

    def __init__(self, lin: nn.Linear, dtype: torch.dtype, head: bool = False, codes: tuple | None = None):
        """`codes`: (q, scale) made beforehand (a GGUF file's tensors, checkpoints/gguf_int8.py)."""
        super().__init__(lin, dtype)
        q, scale = codes if codes is not None else quantize_int8(lin.weight, dtype)
        self.register_buffer("weight", q)                                # (N, K) int8
        self.register_buffer("scales", scale)                            # (N,)
        self.w8a8_rows = w8a8_rows(head)

    def matmul_weight_only(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x, self.weight, self.scales)

    def matmul_int8(self, x: torch.Tensor) -> torch.Tensor:
        """W8A8."""
        return int8_matmul(x, self.weight.t(), self.scales)               # (K, N) view of (N, K)

    def dequantized(self) -> torch.Tensor:
        return self.weight.float() * self.scales.float()[:, None]


class Int8Embedding(nn.Module):
    """An embedding as int8 rows with a scale each, dequantized on gather (ids -> (.., d) in
    `dtype`). `qweight`/`scales` are an Int8Linear's weight and scales: a tied head shares them
    (`as_head`). `weight` is an empty parameter in the compute dtype, for the code that reads the
    model's dtype and device from the embedding (base.new_cache, base._execution_device)."""

    def __init__(self, emb: nn.Embedding, dtype: torch.dtype, codes: tuple | None = None):
        """`codes`: (q, scale) made beforehand (a GGUF file's embedding, checkpoints/gguf_int8.py)."""
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.dtype = emb.num_embeddings, emb.embedding_dim, dtype
        q, scale = codes if codes is not None else quantize_int8(emb.weight, dtype)
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
        head.w8a8_rows = w8a8_rows(head=True)
        return head


def fits(fmt: str, lin: nn.Module) -> bool:
    """Whether the kernel takes this weight (N, K): int4 packs N in 16-row panels and K in groups;
    a linear emptied by fusion (its rows live in the first of its group) has nothing to quantize."""
    N, K = lin.weight.shape
    if lin.weight.numel() == 0 or lin.weight.device.type != "cpu":
        return False
    return fmt == "int8" or (N % 16 == 0 and K % INT4_GROUP == 0)


def quantize_model(model: nn.Module, fmt: str, dtype: torch.dtype, *, head: bool | None = None,
                   embedding: bool = False, skip: tuple[str, ...] = ()) -> dict:
    """Replace `model`'s block linears (after `prepare_for_inference`, which fuses q/k/v and
    gate/up) with Int8Linear / Int4Linear in place. `head`: the output head as int8 too, in both
    formats (None: where it pays, `head_pays`); `embedding`: the input embedding as int8 rows,
    shared with a tied head. `skip`: module-name suffixes kept in float (a family's router).
    Returns counts for the report."""
    make = {"int8": Int8Linear, "int4": Int4Linear}[fmt]
    head = head_pays() if head is None else head
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
    # an embedding or head already int8 (a GGUF file's, placed from its codes) is kept as it is
    out = model.output_head
    if out is None and head:             # tied: one int8 matrix is both the embedding and the head
        emb = model.embed
        if not isinstance(emb, Int8Embedding):
            emb = Int8Embedding(model.embed, dtype)
            _replace(model, model.embed, emb)
        _set_head(model, emb.as_head())
        done.update(embedding="int8", head="int8 (tied: the embedding's rows)")
    elif out is not None and head and (isinstance(out, Int8Linear) or fits("int8", out)):
        if not isinstance(out, Int8Linear):
            _set_head(model, Int8Linear(out, dtype, head=True))
        done["head"] = "int8"
    # a tied embedding stays float under a float head (an int8 embedding would need a float copy)
    if embedding and out is not None and isinstance(model.embed, nn.Embedding):
        _replace(model, model.embed, Int8Embedding(model.embed, dtype))
    if embedding and isinstance(model.embed, Int8Embedding):
        done["embedding"] = "int8"
    model.is_quantized = True            # decode/graphs.py: no CUDA graphs
    model.cpu_quantized = fmt
    return done


def head_pays() -> bool:
    """Whether the output head is quantized by default: as int8 with W8A8 at every row count, in
    both formats, where `_int_mm` is exact (docs/specs/cpu-quantization.md, 1d: 1.1-1.9x bf16 at 1-32
    rows, vocab 152k). Where it is not, a weight-only int8 head is 0.5x bf16 at 32 rows: bf16 stays.
    Not int4: unpacking 152k x d codes at every step costs more than the product (1d)."""
    return w8a8_rows(head=True) is not None


def _replace(root: nn.Module, old: nn.Module, new: nn.Module) -> None:
    for module in root.modules():
        for name, child in module.named_children():
            if child is old:
                setattr(module, name, new)
                return
    raise ValueError(f"{type(old).__name__} not found in the model")


def _set_head(model: nn.Module, head: nn.Module) -> None:
    """At the family's `head_name` (`lm_head`, LLaDA's `model.transformer.ff_out`), in place of
    its head or, tied, where it looks for one."""
    if model.head_name is None:
        raise ValueError(f"{type(model).__name__}: cannot place a quantized output head")
    model.set_output_head(head)
