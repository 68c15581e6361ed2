"""An independent float64 transcription of Nemotron-Labs Diffusion's reference code (the checkpoint's
modeling_nemotron_labs_diffusion.py on the Ministral-3 backbone; docs/specs/nemotron-diffusion.md),
written from the doc and the sources, not from fastdllm: plain loops, a list cache grown and cropped
as transformers' DynamicCache, RoPE inverse frequencies from transformers' own YaRN function.

`forward(W, cfg, ids, cache, causal, keep)` is one call of the encoder: `ids` (B, S) after the
cache's length, `causal` = the layers' diffusion_lm False, `keep` = use_cache (append the K/V).
`generate`, `ar_generate`, `linear_spec_generate` transcribe the three decoders at temperature 0
and return (output ids with the prompt, nfe as the reference counts it, a trace of steps)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file


def load(path: Path) -> tuple[dict, dict]:
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    W = {}
    for f in sorted(path.glob("model-*.safetensors")):
        W.update({k: v.double() for k, v in load_file(str(f)).items()})
    return W, cfg


def load_lora(path: Path) -> dict:
    """layer -> (A, B, alpha / r) from linear_spec_lora/ (PEFT layout)."""
    lora = Path(path) / "linear_spec_lora"
    c = json.loads((lora / "adapter_config.json").read_text())
    w = load_file(str(lora / "adapter_model.safetensors"))
    out = {}
    for name, t in w.items():
        layer = int(name.split(".layers.")[1].split(".")[0])
        out.setdefault(layer, {})["A" if "lora_A" in name else "B"] = t.double()
    return {i: (v["A"], v["B"], c["lora_alpha"] / c["r"]) for i, v in out.items()}


def inv_freq(cfg: dict) -> tuple[torch.Tensor, float]:
    from transformers import ROPE_INIT_FUNCTIONS
    from transformers.models.ministral3 import Ministral3Config

    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")
    rope = dict(cfg["rope_parameters"])
    tc = Ministral3Config(**{k: cfg[k] for k in keys}, rope_parameters=rope)
    return ROPE_INIT_FUNCTIONS[rope["rope_type"]](tc) if rope["rope_type"] != "default" else \
        (1.0 / rope["rope_theta"] ** (torch.arange(0, cfg["head_dim"], 2).float() / cfg["head_dim"]), 1.0)


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def forward(W: dict, cfg: dict, ids: torch.Tensor, cache: list | None, causal: bool, keep: bool,
            lora: dict | None = None) -> torch.Tensor:
    """Logits (B, S, V) of `ids` at positions cache_len .. cache_len + S - 1; `cache` is a list of
    per-layer [K, V] (B, H_kv, T, D), appended to when `keep`."""
    B, S = ids.shape
    H, Hk, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, rope = cfg["rms_norm_eps"], cfg["rope_parameters"]
    past = cache[0][0].shape[2] if cache else 0
    pos = torch.arange(past, past + S, dtype=torch.float64)                       # cache_position
    freq, factor = inv_freq(cfg)
    ang = pos[:, None] * freq.double()[None, :]
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos() * factor, ang.sin() * factor
    scale = 1 + rope["llama_4_scaling_beta"] * torch.log(1 + torch.floor(pos / rope["original_max_position_embeddings"]))
    x = W["encoder.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layers.{i}."
        h = rms(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).view(B, S, H, D).transpose(1, 2)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).view(B, S, Hk, D).transpose(1, 2)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).view(B, S, Hk, D).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        q = q * scale[:, None]
        if cache is not None and len(cache) > i:
            K, V = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
        else:
            K, V = k, v
        if keep:
            if len(cache) > i:
                cache[i] = [K, V]
            else:
                cache.append([K, V])
        K, V = K.repeat_interleave(H // Hk, 1), V.repeat_interleave(H // Hk, 1)
        att = q @ K.transpose(-1, -2) / math.sqrt(D)
        if causal:
            T = K.shape[2]
            allowed = torch.arange(T)[None, :] <= (torch.arange(S) + past)[:, None]
            att = att.masked_fill(~allowed, float("-inf"))
        o = (att.softmax(-1) @ V).transpose(1, 2).reshape(B, S, H * D)
        out = o @ W[p + "self_attn.o_proj.weight"].T
        if lora is not None:
            A, Bm, s = lora[i]
            out = out + s * ((o @ A.T) @ Bm.T)
        x = x + out
        h = rms(x, W[p + "post_attention_layernorm.weight"], eps)
        g, u = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    return rms(x, W["encoder.norm.weight"], eps) @ W["diffusion_head.weight"].T


def _crop(cache: list, n: int) -> None:
    for layer in cache:
        layer[0], layer[1] = layer[0][:, :, :n], layer[1][:, :, :n]


def _no_mask(tokens: torch.Tensor, mask: int) -> None:
    assert not bool((tokens == mask).any()), "the reference predicted the mask id: pick another fixture"


def generate(W, cfg, prompt: torch.Tensor, max_new_tokens: int, block_length: int, threshold=None):
    """C's `generate` (causal_context, T = 0). Trace: per block, (seed, [(step, committed positions
    in the block, tokens)])."""
    mask, eos = cfg["mask_token_id"], cfg["eos_token_id"]
    B, P = prompt.shape
    x = prompt.clone()
    cache: list = []
    nfe = 0
    seed = forward(W, cfg, prompt, cache, True, True)[:, -1].argmax(-1)
    trace = []
    for k in range(max_new_tokens // block_length):
        block = torch.full((B, block_length), mask)
        block[:, 0] = seed
        x = torch.cat([x, block], 1)
        s = P + k * block_length
        n_masked = (x[:, s:] == mask).sum(1)
        sched = torch.zeros(B, block_length, dtype=torch.long) + (n_masked // block_length)[:, None]
        for b in range(B):
            sched[b, :int(n_masked[b] % block_length)] += 1
        steps = []
        for i in range(block_length):
            masked = x[:, s:] == mask
            if masked.sum() == 0:
                break
            nfe += 1
            logits = forward(W, cfg, x[:, s:], cache, False, False)
            p = logits.softmax(-1)
            x0 = logits.argmax(-1)
            x0p = p.gather(-1, x0[..., None])[..., 0]
            x0 = torch.where(masked, x0, x[:, s:])
            conf = torch.where(masked, x0p, torch.tensor(float("-inf"), dtype=torch.float64))
            transfer = torch.zeros_like(masked)
            for b in range(B):
                kk = int(masked[b].sum()) if threshold is not None else int(sched[b, i])
                order = torch.topk(conf[b], k=kk).indices
                transfer[b, order] = True
                if threshold is not None:
                    for j in range(1, kk):
                        if conf[b, order[j]] < threshold:
                            transfer[b, order[j]] = False
            _no_mask(x0[transfer], mask)
            x[:, s:] = torch.where(transfer, x0, x[:, s:])
            steps.append((i, [transfer[b].nonzero()[:, 0].tolist() for b in range(B)], x[:, s:].clone()))
            blk = x[:, s:]
            is_eos = blk == eos
            if is_eos.any():
                before = (blk == mask) & ~is_eos.cumsum(1).bool()
                if (is_eos.any(1) & ~before.any(1)).any():
                    break
        trace.append((seed.clone(), steps))
        seed = forward(W, cfg, x[:, s:], cache, True, True)[:, -1].argmax(-1)
        nfe += 1
        gen = x[:, P:] == eos
        if gen.any(1).all():
            return x[:, :P + int(gen.long().argmax(1).max()) + 1], nfe, trace
    return x, nfe, trace


def ar_generate(W, cfg, prompt: torch.Tensor, max_new_tokens: int):
    eos = cfg["eos_token_id"]
    cache: list = []
    logit = forward(W, cfg, prompt, cache, True, True)[:, -1]
    out, nfe = [], 0
    for step in range(max_new_tokens):
        nfe += 1
        token = logit.argmax(-1, keepdim=True)
        out.append(token)
        if bool((token == eos).all()):
            break
        if step < max_new_tokens - 1:
            logit = forward(W, cfg, token, cache, True, True)[:, -1]
    return torch.cat([prompt, *out], 1), nfe


def linear_spec_generate(W, cfg, prompt: torch.Tensor, max_new_tokens: int, block_length: int,
                         threshold: float = 0.0, lora: dict | None = None):
    """C's `linear_spec_generate` (batch 1, T = 0). Trace: per round, (drafted block, accepted count)."""
    mask, eos = cfg["mask_token_id"], cfg["eos_token_id"]
    cache: list = []
    seed = forward(W, cfg, prompt, cache, True, True)[:, -1].argmax(-1, keepdim=True)
    nfe = 1
    if int(seed) == eos:
        return torch.cat([prompt, seed], 1), nfe, []
    generated, total, trace = [seed], 1, []
    while total < max_new_tokens:
        cache_len = cache[0][0].shape[2]
        block = torch.full((1, block_length), mask)
        block[0, 0] = int(seed)
        while True:
            is_mask = block == mask
            if not is_mask.any():
                break
            logits = forward(W, cfg, block, cache, False, False, lora)
            nfe += 1
            tokens, probs = logits.argmax(-1), logits.softmax(-1)
            if threshold > 0:
                conf = torch.where(is_mask, probs.gather(-1, tokens[..., None])[..., 0],
                                   torch.tensor(float("-inf"), dtype=torch.float64))
                unmask = conf >= threshold
                if not unmask.any():
                    unmask = torch.zeros_like(is_mask)
                    unmask.view(-1)[conf.view(-1).argmax()] = True
                _no_mask(tokens[unmask], mask)
                block[unmask] = tokens[unmask]
            else:
                _no_mask(tokens[is_mask], mask)
                block[is_mask] = tokens[is_mask]
                break
        ar = forward(W, cfg, block, cache, True, True).argmax(-1)
        nfe += 1
        accepted = 0
        for i in range(block_length - 1):
            if int(ar[0, i]) == int(block[0, i + 1]):
                accepted += 1
            else:
                break
        accepted += 1
        toks = ar[:, :accepted]
        trace.append((block.clone(), accepted))
        generated.append(toks)
        total += accepted
        _crop(cache, cache_len + accepted)
        seed = ar[:, accepted - 1:accepted]
        hits = (toks[0] == eos).nonzero()[:, 0]
        if len(hits):
            generated[-1] = toks[:, :int(hits[0]) + 1]
            break
    return torch.cat([prompt, *generated], 1), nfe, trace
