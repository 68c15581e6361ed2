"""An independent, deliberately naive transcription of the authors' algorithm (NVlabs/Fast-dLLM v1,
`llada/generate.py`: generate / generate_with_prefix_cache / generate_with_dual_cache with the
fixed, threshold and factor rules), written for these tests from ../shared/specs/reference-algorithm.md.

It shares no code with fastdllm's model or engine: its forward reads the weights by their
checkpoint names and caches keys *before* RoPE, re-applying RoPE to the whole key sequence at every
forward (as the reference modelling code does); confidences come from a float64 softmax over the
whole vocabulary; selection loops over rows with topk. Known quirks are switches:

- factor_quirk: the reference commits every candidate when only the last-ranked one fails the bound.
- ban_mask: fastdllm never lets the mask id be predicted (the reference can loop forever on it).
- Dream: `shift_span` lets a cached forward start one slot before the block (fastdllm's fix); the
  authors' Dream code instead commits the block's first token unconditionally (`dream_first_token`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


class NaiveLM:
    """Reads the weights from the checkpoint files themselves (float64), not from fastdllm's model."""

    def __init__(self, lm, dtype=torch.float64):
        self.sd = {}
        for shard in sorted(lm.path.glob("*.safetensors")):
            self.sd.update({k: v.to(dtype) for k, v in load_file(shard).items()})
        self.dream = lm.family == "Dream"
        c = lm.model.config
        if self.dream:
            self.L, self.H, self.Hkv = c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads
            self.D, self.theta, self.eps = c.hidden_size // c.num_attention_heads, c.rope_theta, c.rms_norm_eps
        else:
            self.L, self.H, self.Hkv = c.n_layers, c.n_heads, c.n_kv_heads
            self.D, self.theta, self.eps = c.d_model // c.n_heads, c.rope_theta, c.rms_norm_eps

    def w(self, name):
        return self.sd[name]

    def names(self, i):
        if self.dream:
            p = f"model.layers.{i}."
            return dict(n1=p + "input_layernorm", q=p + "self_attn.q_proj", k=p + "self_attn.k_proj",
                        v=p + "self_attn.v_proj", o=p + "self_attn.o_proj", n2=p + "post_attention_layernorm",
                        g=p + "mlp.gate_proj", u=p + "mlp.up_proj", d=p + "mlp.down_proj")
        p = f"model.transformer.blocks.{i}."
        return dict(n1=p + "attn_norm", q=p + "q_proj", k=p + "k_proj", v=p + "v_proj", o=p + "attn_out",
                    n2=p + "ff_norm", g=p + "ff_proj", u=p + "up_proj", d=p + "ff_out")

    def lin(self, x, name):
        b = self.sd.get(name + ".bias")
        return x @ self.w(name + ".weight").T + (0 if b is None else b)

    def norm(self, x, name):
        h = x.double()
        return self.w(name + ".weight") * (h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def rope(self, x, pos):  # x (B, H, S, D), pos (S,)
        inv = 1.0 / self.theta ** (torch.arange(0, self.D, 2, dtype=torch.float64) / self.D)
        ang = pos.double()[:, None] * inv[None, :]
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
        x1, x2 = x[..., : self.D // 2], x[..., self.D // 2:]
        return (x * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)

    def forward(self, ids, offset=0, past=None, replace=None, q_pos=None, k_pos=None):
        """ids (B, S) at canvas offset. past: per layer (k, v) pre-RoPE; with `replace` = (s, e) the
        new k/v overwrite past[:, :, s:e] (dual cache), else they are appended (prefix cache).
        q_pos (S,) / k_pos (one per key): RoPE positions other than the slots' own (DPad's kept
        slots keep their canvas positions). Returns logits (B, S, V) for every fed position and
        the per-layer (k, v) attended to."""
        B, S = ids.shape
        x = self.w("model.embed_tokens.weight" if self.dream else "model.transformer.wte.weight")[ids]
        new_past = []
        for i in range(self.L):
            n = self.names(i)
            h = self.norm(x, n["n1"])
            q = self.lin(h, n["q"]).view(B, S, self.H, self.D).transpose(1, 2)
            k = self.lin(h, n["k"]).view(B, S, self.Hkv, self.D).transpose(1, 2)
            v = self.lin(h, n["v"]).view(B, S, self.Hkv, self.D).transpose(1, 2)
            if past is not None and replace is not None:
                pk, pv = past[i][0].clone(), past[i][1].clone()
                pk[:, :, replace[0]:replace[1]], pv[:, :, replace[0]:replace[1]] = k, v
                k, v = pk, pv
            elif past is not None:
                k, v = torch.cat([past[i][0], k], 2), torch.cat([past[i][1], v], 2)
            new_past.append((k, v))
            assert k_pos is None or k.shape[2] == len(k_pos)
            q = self.rope(q, torch.arange(offset, offset + S) if q_pos is None else q_pos)
            kr = self.rope(k, torch.arange(k.shape[2]) if k_pos is None else k_pos)
            rep = self.H // self.Hkv
            kr, vv = kr.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            att = torch.softmax(q @ kr.transpose(-1, -2) / self.D ** 0.5, -1)
            x = x + self.lin((att @ vv).transpose(1, 2).reshape(B, S, -1), n["o"])
            h = self.norm(x, n["n2"])
            x = x + self.lin(F.silu(self.lin(h, n["g"])) * self.lin(h, n["u"]), n["d"])
        x = self.norm(x, "model.norm" if self.dream else "model.transformer.ln_f")
        head = "lm_head.weight" if self.dream else "model.transformer.ff_out.weight"
        if self.dream:  # shifted: position i predicted from i - 1 (the hidden states shifted, not the
            x = torch.cat([x[:, :1], x[:, :-1]], 1)      # logits: each row's head is its own; a 152k copy less)
        return x @ self.w(head).T, new_past


def num_transfer_tokens(mask_index, steps):
    counts = mask_index.sum(1)
    out = torch.zeros(mask_index.shape[0], steps, dtype=torch.long) + (counts // steps)[:, None]
    for row in range(mask_index.shape[0]):
        out[row, : int(counts[row] % steps)] += 1
    return out


def transfer(logits, mask_index, x, k_fixed, threshold, factor, mask_id, factor_quirk, ban_mask, measure="prob"):
    """The reference's get_transfer_index / get_transfer_index_dynamic at temperature 0. Confidence
    as the authors compute it, over the full softmax (the mask id included): the prediction's
    probability (LLaDA, Dream's maskgit_plus), top-1 minus top-2 (Dream's topk_margin) or
    sum p log(p + 1e-10) (Dream's entropy). `ban_mask` keeps the mask id out of the argmax only.
    Computed over the span of canvas positions that hold a mask in some row (each position's
    softmax is its own, so the others' values never matter; a 152k-token vocabulary made the
    whole canvas the test's cost)."""
    cols = mask_index.any(0).nonzero()[:, 0]
    lo, hi = (int(cols[0]), int(cols[-1]) + 1) if len(cols) else (0, 0)
    x0, conf = x.clone(), torch.full(x.shape, float("-inf"), dtype=torch.float64)
    x0[:, lo:hi], conf[:, lo:hi] = confidence_at(logits[:, lo:hi], mask_index[:, lo:hi], x[:, lo:hi], mask_id,
                                                 ban_mask, measure)
    chosen = torch.zeros_like(x0, dtype=torch.bool)
    for j in range(conf.shape[0]):
        n_masked = int(mask_index[j].sum())
        if n_masked == 0:
            continue
        if factor is not None:
            srt = torch.sort(conf[j][mask_index[j]], descending=True)[0]
            top = n_masked
            for r in range(n_masked):  # accept rank r+1 while (n+1)(1 - c_n) <= f; rank 1 always
                if r > 0 and srt[r] < 1 - factor / (r + 2):
                    top = r
                    break
            if factor_quirk and top == n_masked - 1:
                top = n_masked
            _, idx = torch.topk(conf[j], k=top)
            chosen[j, idx] = True
        elif threshold is not None:
            val, idx = torch.topk(conf[j], k=n_masked)
            chosen[j, idx[0]] = True
            chosen[j, idx[1:][val[1:] >= threshold]] = True
        else:
            _, idx = torch.topk(conf[j], k=int(k_fixed[j]))
            chosen[j, idx] = True
    return x0, chosen, conf


def confidence_at(logits, mask_index, x, mask_id, ban_mask, measure):
    """transfer's prediction and confidence at the positions of `logits` (B, n, V): (x0, conf) (B, n)."""
    p = torch.softmax(logits.double(), -1)
    if ban_mask:
        logits = logits.clone()
        logits[..., mask_id] = float("-inf")
    x0 = logits.argmax(-1)
    if measure == "prob":
        x0_p = p.gather(-1, x0[..., None])[..., 0]
    elif measure == "margin":
        top = torch.sort(p, -1, descending=True).values
        x0_p = top[..., 0] - top[..., 1]
    else:
        x0_p = torch.sum(p * torch.log(p + 1e-10), -1)
    x0 = torch.where(mask_index, x0, x)
    return x0, torch.where(mask_index, x0_p, torch.tensor(float("-inf"), dtype=torch.float64))


def reference_generate(lm, prompt, *, cache, gen_length, block_length, steps=None, threshold=None,
                       factor=None, mask_id, factor_quirk=False, ban_mask=True, measure="prob", record=None,
                       dtype=torch.float64):
    """cache in {"none", "prefix", "dual"}; returns (canvas (B, P+G), nfe). `record` (a list) gets
    the set of committed canvas positions of every step. `dtype`: the weights' and the forward's
    (the confidences are a float64 softmax of its logits whatever it is, as the authors')."""
    net = NaiveLM(lm, dtype)
    B, P = prompt.shape
    x = torch.full((B, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    num_blocks = gen_length // block_length
    steps = steps or gen_length
    spb = steps // num_blocks
    shift = 1 if net.dream else 0
    nfe = 0

    def decide(logits, view, mask_index, i):
        k = ntt[:, min(i, spb - 1)] if threshold is None and factor is None else None
        x0, chosen, _ = transfer(logits, mask_index, view, k, threshold, factor, mask_id, factor_quirk, ban_mask,
                                  measure)
        view[chosen] = x0[chosen]
        return chosen

    for b in range(num_blocks):
        s, e = P + b * block_length, P + (b + 1) * block_length
        ntt = num_transfer_tokens(x[:, s:e] == mask_id, spb)
        # first step of the block: a full forward (the cache refresh), fused with a decision
        logits, past = net.forward(x)
        nfe += 1
        mask_index = x == mask_id
        mask_index[:, e:] = False
        chosen = decide(logits, x, mask_index, 0)
        if record is not None:
            record.append(chosen.nonzero().tolist())
        i = 1
        while (x[:, s:e] == mask_id).any():
            a = s - shift
            if cache == "none":
                logits, _ = net.forward(x)
                view, lo = x, 0
            elif cache == "prefix":
                logits, _ = net.forward(x[:, a:], offset=a, past=[(k[:, :, :a], v[:, :, :a]) for k, v in past])
                view, lo = x[:, a:], a
            else:
                logits, past = net.forward(x[:, a:e], offset=a, past=past, replace=(a, e))
                view, lo = x[:, a:e], a
            nfe += 1
            mask_index = view == mask_id
            mask_index[:, : s - lo] = False          # only the block's own positions
            mask_index[:, e - lo:] = False
            chosen = decide(logits, view, mask_index, i)
            if record is not None:
                record.append([[r, c + lo] for r, c in chosen.nonzero().tolist()])
            i += 1
    return x, nfe


def cached_forward(net, x, cache: str, a: int, e: int, past):
    """One cached step of Fast-dLLM's block loop, for transcriptions that run on its caches: prefix
    recomputes [a, T) against the first a cached slots, dual recomputes [a, e) written into the
    cache. Returns (logits of the recomputed span, the cache, the canvas offset of logits' row 0)."""
    if cache == "prefix":
        logits, _ = net.forward(x[:, a:], offset=a, past=[(k[:, :, :a], v[:, :, :a]) for k, v in past])
        return logits, past, a
    logits, past = net.forward(x[:, a:e], offset=a, past=past, replace=(a, e))
    return logits, past, a
