"""An independent transcription of Steerling's forward and `SteerlingGenerator.generate_full`
(steerling 0.2.0, docs/specs/steerling.md 3-5), written from reading the authors' code: plain loops, the
whole canvas every step, the authors' fp32 points (RMSNorm normalises in fp32, RoPE rotates in
fp32, the rule reads fp32 logits), the concept heads computed and composed with the epsilon
correction so that the path whose result fastdllm skips is exercised. Batch 1."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors.torch import load_file


def load_tensors(folder: Path) -> dict[str, torch.Tensor]:
    weights = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        weights.update({k: v.double() for k, v in load_file(str(file)).items()})
    return weights


def rms_norm(x, weight, eps):
    x32 = x.float()
    return (weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def rope(t, base):
    """t (H, T, D): positions 0..T-1, tables and rotation in fp32, cast back."""
    H, T, D = t.shape
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float), inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    tf = t.float()
    x1, x2 = tf[..., :D // 2], tf[..., D // 2:]
    return (tf * angles.cos() + torch.cat((-x2, x1), dim=-1) * angles.sin()).to(t.dtype)


def hidden(w: dict, c: dict, ids: list[int]) -> torch.Tensor:
    """ln_f of the backbone over the whole canvas: (T, d)."""
    d, H, kv = c["n_embd"], c["n_head"], c["n_kv_heads"]
    hd, T, eps, block = d // H, len(ids), c["norm_eps"], c["diff_block_size"]
    x = w["transformer.tok_emb.weight"][torch.tensor(ids)]
    allowed = torch.tensor([[q // block >= k // block for k in range(T)] for q in range(T)])
    for i in range(c["n_layers"]):
        p = f"transformer.blocks.{i}."
        qkv = x @ w[p + "attn.c_attn.weight"].T
        if c["clip_qkv"] is not None:
            qkv = qkv.clamp(-c["clip_qkv"], c["clip_qkv"])
        q, k, v = qkv[:, :d], qkv[:, d:d + kv * hd], qkv[:, d + kv * hd:]
        q = rms_norm(q.reshape(T, H, hd).transpose(0, 1), w[p + "attn.q_norm.weight"], eps)
        k = rms_norm(k.reshape(T, kv, hd).transpose(0, 1), w[p + "attn.k_norm.weight"], eps)
        v = v.reshape(T, kv, hd).transpose(0, 1)
        q, k = rope(q, c["rope_base"]), rope(k, c["rope_base"])
        k, v = k.repeat_interleave(H // kv, 0), v.repeat_interleave(H // kv, 0)   # query head h -> kv head h // group
        scores = (q @ k.transpose(1, 2)) / math.sqrt(hd)
        scores = scores.masked_fill(~allowed, float("-inf"))
        attn = (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(T, d) @ w[p + "attn.c_proj.weight"].T
        x = x + rms_norm(attn, w[p + "ln_1.weight"], eps)                     # post-norm
        inner = x @ w[p + "mlp.c_fc.weight"].T
        half = inner.shape[-1] // 2
        up, gate = inner[:, :half], inner[:, half:]                           # up first, gate second
        mlp = (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.c_proj.weight"].T
        x = x + rms_norm(mlp, w[p + "ln_2.weight"], eps)
    return rms_norm(x, w["transformer.ln_f.weight"], eps)


def composed(w: dict, c: dict, h: torch.Tensor) -> torch.Tensor:
    """The interpretable model's composition: known + unknown features, epsilon-corrected (= h up to rounding)."""
    def top_mix(scores, k, rows):
        weights = torch.sigmoid(scores.float().clamp(-15, 15)).to(h.dtype)
        top = weights.topk(min(k, weights.shape[-1]), -1)
        return torch.einsum("tk,tkd->td", top.values, rows[top.indices])

    known = top_mix(h @ w["known_head.concept_predictor.weight"].T, c["topk_known_features"],
                    w["known_head.concept_embedding.weight"])
    unknown_scores = (h @ w["unknown_head.predictor_down.weight"].T) @ w["unknown_head.predictor_up.weight"].T
    unk_hat = top_mix(unknown_scores, c["unknown_topk"], w["unknown_head.embedding_coef.weight"]) \
        @ w["unknown_head.embedding_basis.weight"].T
    epsilon = h - (unk_hat + known)
    return (unk_hat + epsilon) + known


def logits(w: dict, c: dict, ids: list[int]) -> torch.Tensor:
    head = w.get("transformer.lm_head.weight", w["transformer.tok_emb.weight"])
    return composed(w, c, hidden(w, c, ids)) @ head.T


def sample_token(z, entropy_sampling, temperature, top_p, generator):
    def top_p_draw(probs):
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = (torch.cumsum(sorted_probs, -1) - sorted_probs) <= top_p
        keep[0] = True
        kept = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        return int(order[torch.multinomial(kept / kept.sum(), 1, generator=generator)].squeeze(0))

    if entropy_sampling:
        p = torch.softmax(z, -1)
        cumulative = torch.cumsum(torch.sort(p, descending=True).values, -1)
        effective = max((cumulative <= top_p).sum().item() + 1, 2)
        entropy = -torch.sum(p * torch.log(p + 1e-10))
        tau = 0.3 + 0.4 * min(1.0, entropy.item() / math.log(effective))
        return top_p_draw(torch.softmax(z / tau, -1))
    if top_p > 0.0 and temperature > 0.0:
        return top_p_draw(torch.softmax(z / temperature, -1))
    return int(torch.argmax(z))


def generate_full(folder: Path, prompt: list[int], *, max_new_tokens: int, steps: int | None = None,
                  temperature=1.2, top_p=0.8, repetition_penalty=1.1, entropy_sampling=True, seed=0,
                  stop_tokens=(), eot_id=None) -> dict:
    """tokens (the output walk), canvas, nfe, stop ('length' | 'stop' | 'eot')."""
    import json

    c = json.loads((Path(folder) / "config.json").read_text())
    w = load_tensors(folder)
    mask, eos, pad, block = c["mask_token_id"], c["eos_token_id"], c["pad_token_id"], c["diff_block_size"]
    L, G = len(prompt), max_new_tokens
    steps = steps or G
    generator = torch.Generator().manual_seed(seed)
    x = list(prompt) + [mask] * G
    blocks = G // block
    per_block = steps // blocks
    nfe, stop = 0, "length"
    for b in range(blocks):
        start, end = L + b * block, L + (b + 1) * block
        quota = [block // per_block + (1 if j < block % per_block else 0) for j in range(per_block)]
        for j in range(per_block):
            out = logits(w, c, x)
            nfe += 1
            masked = [p for p in range(start, end) if x[p] == mask]
            if not masked:
                continue
            z = out[masked].float()
            if repetition_penalty != 1.0:
                seen = sorted(set(t for t in x if 0 <= t < z.shape[-1]))
                values = z[:, seen]
                z[:, seen] = torch.where(values > 0, values / repetition_penalty, values * repetition_penalty)
            z[:, eos] = float("-inf")
            z[:, [mask, pad]] = float("-inf")
            confidence = torch.softmax(z, -1).max(-1).values
            if quota[j] == 0:
                continue
            for pick in confidence.topk(min(quota[j], len(masked))).indices.tolist():
                token = sample_token(z[pick], entropy_sampling, temperature, top_p, generator)
                x[masked[pick]] = token
                if eot_id is not None and token == eot_id:
                    x[masked[pick] + 1:] = [eos] * (len(x) - masked[pick] - 1)
                    stop = "eot"
                    break
            if stop == "eot":
                break
        if stop == "eot":
            break
        if stop_tokens and any(t in stop_tokens for t in x[L:end]):
            stop = "stop"
            break
    terminal = set(stop_tokens) | ({eot_id} if eot_id is not None else set())
    tokens = []
    for t in x[L:]:
        if t in (mask, eos):
            continue
        if t in terminal:
            break
        tokens.append(t)
    return {"tokens": tokens, "canvas": x[L:], "nfe": nfe, "stop": stop}
