"""A small writer of llama.cpp's k-quant blocks (Q4_K, Q5_K, Q6_K), for tests and measurements:
the gguf package dequantizes these types but cannot quantize them. The block layouts are those its
`quants.py` reads (docs/specs/gguf.md 11); the rounding is the plain one (each sub-block's range, no
search over scales as llama.cpp's `make_qkx2_quants` does), so a real file's error against the
original weights is somewhat smaller, while the grid the values lie on is the same.

Every function takes rows (..., K) float32 with K a multiple of 256 and returns the bytes the
reader maps, (..., K / 256 * type size) uint8, ready for `GGUFWriter.add_tensor(raw_dtype=...)`."""

from __future__ import annotations

import numpy as np

QK = 256                   # values per super-block


def quantize_kquant(rows: np.ndarray, qtype: str) -> np.ndarray:
    rows = np.asarray(rows, np.float32)
    blocks = rows.reshape(-1, QK)                                         # (n, 256)
    packed = {"Q4_K": lambda b: _q45_k(b, 4), "Q5_K": lambda b: _q45_k(b, 5), "Q6_K": _q6_k}[qtype](blocks)
    return packed.reshape(*rows.shape[:-1], -1)


def _f16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fp16 bytes (n, 2), the fp16 value back as float32 (n, 1))."""
    h = x.astype(np.float16).reshape(-1, 1)
    return h.view(np.uint8).reshape(-1, 2), h.astype(np.float32)


def _q45_k(blocks: np.ndarray, bits: int) -> np.ndarray:
    """w = d * sc_j * q - dmin * m_j over 8 sub-blocks j of 32 values; sc_j, m_j 6-bit, q `bits`-bit.
    Layout: d, dmin (fp16), 12 bytes of packed sc/m, (Q5_K: 32 bytes of fifth bits), 128 bytes of nibbles."""
    n = blocks.shape[0]
    top = (1 << bits) - 1
    sub = blocks.reshape(n, 8, 32)
    lo = np.minimum(sub.min(-1), 0)                                       # the offset is never positive
    scale, offset = (sub.max(-1) - lo) / top, -lo                         # (n, 8) each, >= 0
    d_bytes, d = _f16(scale.max(-1) / 63)
    m_bytes, dmin = _f16(offset.max(-1) / 63)
    sc = np.where(d > 0, np.round(scale / np.where(d > 0, d, 1)), 0).clip(0, 63).astype(np.uint8)
    mn = np.where(dmin > 0, np.round(offset / np.where(dmin > 0, dmin, 1)), 0).clip(0, 63).astype(np.uint8)
    step = (d * sc)[..., None]                                            # (n, 8, 1)
    q = np.where(step > 0, np.round((sub + (dmin * mn)[..., None]) / np.where(step > 0, step, 1)), 0)
    q = q.clip(0, top).astype(np.uint8)                                   # (n, 8, 32)
    # scales: bytes 0-3 sc_0..3 (+ top 2 bits of sc_4..7), 4-7 the same for m, 8-11 low nibbles of sc/m 4..7
    packed_scales = np.concatenate([sc[:, :4] | ((sc[:, 4:] >> 4) << 6), mn[:, :4] | ((mn[:, 4:] >> 4) << 6),
                                    (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)], 1)
    low = q & 15
    nibbles = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(n, 128)        # chunk c: sub-blocks 2c (low), 2c+1 (high)
    parts = [d_bytes, m_bytes, packed_scales]
    if bits == 5:                                                         # bit j of byte k: sub-block j's value k, bit 4
        high = (q >> 4).astype(np.uint8)                                  # (n, 8, 32)
        parts.append(np.bitwise_or.reduce(high << np.arange(8, dtype=np.uint8)[None, :, None], axis=1))
    return np.concatenate(parts + [nibbles], 1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    """w = d * sc_j * (q - 32) over 16 sub-blocks j of 16 values; sc_j int8, q 6-bit. As Q4_0 does, a
    sub-block's largest-magnitude value maps to code -32. Layout: 128 bytes of low nibbles, 64 of
    high bit pairs, 16 int8 scales, d (fp16)."""
    n = blocks.shape[0]
    sub = blocks.reshape(n, 16, 16)
    extreme = np.take_along_axis(sub, np.abs(sub).argmax(-1)[..., None], -1)[..., 0]
    scale = extreme / -32                                                 # (n, 16), signed
    d_bytes, d = _f16(np.abs(scale).max(-1) / 127)
    sc = np.where(d > 0, np.round(scale / np.where(d > 0, d, 1)), 0).clip(-127, 127).astype(np.int8)
    step = (d * sc)[..., None]
    q = np.where(step != 0, np.round(sub / np.where(step != 0, step, 1)), 0).clip(-32, 31) + 32
    q = q.astype(np.uint8).reshape(n, 2, 4, 32)                           # halves of 128, four groups of 32
    ql = (q[:, :, 0:2] & 15) | ((q[:, :, 2:4] & 15) << 4)                 # (n, 2, 2, 32): groups 0,1 low; 2,3 high
    qh = np.bitwise_or.reduce((q >> 4) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None], axis=2)
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), d_bytes], 1)
