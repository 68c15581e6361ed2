"""An independent, deliberately naive transcription of dLLM-Cache on LLaDA (maomaocun/dLLM-cache
`17235bf`: `generate` in `utils/generate_function.py`, the layer hook `cache_hook_feature` with
`refresh_index` and the RoPE override of `dllm_cache/hooks/cache_hook_LLaDA.py`, the step counter of
`dllm_cache/cache/Cache.py`), written for these tests from docs/accelerators/dllm-cache.md 5.1.

It shares no code with fastdllm's model, cache or engine: the weights are tests/reference.py's
NaiveLM (read from the checkpoint files, float64). The cache is theirs: per layer, separate
entries for the prompt and for the response, each holding *pre-RoPE* k and v, the attention output
(after attn_out) and the MLP output (ff_out's), re-assembled by concatenation [prompt, response]
at every layer; RoPE is applied inside each attention call, queries at their own positions (their
q_index), keys at 0..T-1. The step counter is theirs: one counter per layer, bumped as the layer
starts; the current step is the maximum over layers (so every layer of forward n sees n).

Their four branches per layer, literally (rp: the prompt refreshes, rg: the response refreshes;
layer 0 always both; transfer: 0 < transfer_ratio <= 1):
- rp and rg: everything recomputed and cached;
- rg only: the response's q/k/v, attention against [cached prompt k/v, fresh response k/v], MLP of
  the response; the prompt's attention and MLP from the cache;
- rp only: the prompt's q/k/v; with transfer, the response's V all recomputed, the picked slots'
  q/k recomputed (k scattered into the cached k), and attention and MLP of [prompt, picked];
- neither: with transfer the same for the picked slots alone against the cached prompt k/v.
The picked slots (`refresh_index`): per row the int(G * r) response slots of lowest cosine
similarity between the fresh V and the cached V (flattened over heads).

Their generate: blocks of the fixed schedule (`get_num_transfer_tokens`), logits of the response,
argmax, float64 softmax probability, -inf after the block, topk per row; the cache reset once per
call with the prompt length. Not theirs, on purpose: `ban_mask` (fastdllm never predicts the mask
id; it stays in the softmax). Equal-length prompts only (their batch has one prompt length and
their attention no padding mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from reference import NaiveLM, num_transfer_tokens
from reference_dkv import rope_at


class TheirCache:
    """Their dLLMCache singleton, for one generate call: features by (part, layer, name)."""

    def __init__(self, layers, prompt_length, prompt_interval_steps, gen_interval_steps, transfer_ratio):
        self.prompt_length = prompt_length
        self.prompt_interval_steps, self.gen_interval_steps = prompt_interval_steps, gen_interval_steps
        self.transfer_ratio = transfer_ratio
        self.counter = [0] * layers
        self.features = {}

    def current_step(self):
        return max(self.counter)

    def set(self, part, layer, name, value):
        self.features[part, layer, name] = value

    def get(self, part, layer, name):
        return self.features[part, layer, name]


def refresh_index(new_v, cached_v, ratio):
    """(B, G, dkv) twice -> per row the int(G * ratio) response indices of lowest cosine similarity."""
    B, G, _ = new_v.shape
    picked = []
    for row in range(B):
        sims = []
        for j in range(G):
            a, b = new_v[row, j], cached_v[row, j]
            sims.append(float((a * b).sum() / (a.norm() * b.norm())))
        picked.append(sorted(range(G), key=lambda j: sims[j])[:int(G * ratio)])
    return torch.tensor(picked, dtype=torch.long).view(B, -1)


def hooked_layer(net, i, x, cache, trace):
    """Their cache_hook_feature for LLaDA layer i: x (B, T, d) -> (B, T, d)."""
    n = net.names(i)
    cache.counter[i] += 1
    step, P = cache.current_step(), cache.prompt_length
    rg = (step - 1) % cache.gen_interval_steps == 0 or i == 0
    rp = (step - 1) % cache.prompt_interval_steps == 0 or i == 0
    transfer = 0 < cache.transfer_ratio <= 1
    B, T, d = x.shape
    key_pos = torch.arange(T).expand(B, T)

    def project(h):
        return net.lin(h, n["q"]), net.lin(h, n["k"]), net.lin(h, n["v"])

    def attention(q, k, v, q_pos):     # q (B, nq, d), k/v (B, T, dkv) pre-RoPE; q_pos (B, nq)
        nq = q.shape[1]
        qh = rope_at(net, q.view(B, nq, net.H, net.D).transpose(1, 2), q_pos)
        kh = rope_at(net, k.view(B, T, net.Hkv, net.D).transpose(1, 2), key_pos)
        vh = v.view(B, T, net.Hkv, net.D).transpose(1, 2)
        rep = net.H // net.Hkv
        att = torch.softmax(qh @ kh.repeat_interleave(rep, 1).transpose(-1, -2) / net.D ** 0.5, -1)
        return net.lin((att @ vh.repeat_interleave(rep, 1)).transpose(1, 2).reshape(B, nq, -1), n["o"])

    def mlp(h):
        a = net.norm(h, n["n2"])
        return net.lin(F.silu(net.lin(a, n["g"])) * net.lin(a, n["u"]), n["d"])

    def gather(t, idx):
        return t.gather(1, idx[..., None].expand(-1, -1, t.shape[-1]))

    def scattered(t, idx, src):
        return t.clone().scatter_(1, idx[..., None].expand(-1, -1, t.shape[-1]), src)

    xn = net.norm(x, n["n1"])
    prompt_pos = torch.arange(P).expand(B, P)
    gen_pos = torch.arange(P, T).expand(B, T - P)
    index = None
    if rg and rp:
        q, k, v = project(xn)
        cache.set("prompt", i, "k", k[:, :P]), cache.set("prompt", i, "v", v[:, :P])
        cache.set("gen", i, "k", k[:, P:]), cache.set("gen", i, "v", v[:, P:])
        att = attention(q, k, v, key_pos)
        cache.set("prompt", i, "attn", att[:, :P]), cache.set("gen", i, "attn", att[:, P:])
    elif rg:
        q, k_gen, v_gen = project(xn[:, P:])
        cache.set("gen", i, "k", k_gen), cache.set("gen", i, "v", v_gen)
        k = torch.cat([cache.get("prompt", i, "k"), k_gen], 1)
        v = torch.cat([cache.get("prompt", i, "v"), v_gen], 1)
        att_gen = attention(q, k, v, gen_pos)
        cache.set("gen", i, "attn", att_gen)
        att = torch.cat([cache.get("prompt", i, "attn"), att_gen], 1)
    else:
        if rp:
            q_prompt, k_prompt, v_prompt = project(xn[:, :P])
            cache.set("prompt", i, "k", k_prompt), cache.set("prompt", i, "v", v_prompt)
        att_gen = cache.get("gen", i, "attn")
        if transfer:
            v_gen = net.lin(xn[:, P:], n["v"])
            index = refresh_index(v_gen, cache.get("gen", i, "v"), cache.transfer_ratio)
            selected = gather(xn[:, P:], index)
            q_sel, k_sel = net.lin(selected, n["q"]), net.lin(selected, n["k"])
            cache.set("gen", i, "v", v_gen)
            cache.set("gen", i, "k", scattered(cache.get("gen", i, "k"), index, k_sel))
        k = torch.cat([cache.get("prompt", i, "k"), cache.get("gen", i, "k")], 1)
        v = torch.cat([cache.get("prompt", i, "v"), cache.get("gen", i, "v")], 1)
        queries, q_pos = [], []
        if rp:
            queries.append(q_prompt), q_pos.append(prompt_pos)
        if transfer:
            queries.append(q_sel), q_pos.append(index + P)
        if queries:
            out = attention(torch.cat(queries, 1), k, v, torch.cat(q_pos, 1))
            if rp:
                cache.set("prompt", i, "attn", out[:, :P])
            if transfer:
                att_gen = scattered(att_gen, index, out[:, P if rp else 0:])
                cache.set("gen", i, "attn", att_gen)
        att = torch.cat([cache.get("prompt", i, "attn"), att_gen], 1)
    if trace is not None:
        trace.append((step, i, rp, rg, None if index is None else (index + P).tolist()))
    x = x + att
    if rg and rp:
        m = mlp(x)
        cache.set("prompt", i, "mlp", m[:, :P]), cache.set("gen", i, "mlp", m[:, P:])
    elif rg:
        m_gen = mlp(x[:, P:])
        cache.set("gen", i, "mlp", m_gen)
        m = torch.cat([cache.get("prompt", i, "mlp"), m_gen], 1)
    else:
        m_gen = cache.get("gen", i, "mlp")
        rows = ([x[:, :P]] if rp else []) + ([gather(x[:, P:], index)] if transfer else [])
        if rows:
            out = mlp(torch.cat(rows, 1))
            if rp:
                cache.set("prompt", i, "mlp", out[:, :P])
            if transfer:
                m_gen = scattered(m_gen, index, out[:, P if rp else 0:])
                cache.set("gen", i, "mlp", m_gen)
        m = torch.cat([cache.get("prompt", i, "mlp"), m_gen], 1)
    return x + m


def dllm_cache_generate(lm, prompt, *, gen_length, block_length, steps, prompt_interval_steps,
                        gen_interval_steps, transfer_ratio, mask_id, ban_mask=True, record=None, trace=None):
    """prompt (B, P), equal lengths. Returns (canvas (B, P+G), nfe). `record` gets each step's sorted
    [row, canvas position, token] commits; `trace` each layer's (step, layer, prompt refreshed,
    response refreshed, picked canvas slots per row or None)."""
    net = NaiveLM(lm)
    B, P = prompt.shape
    x = torch.full((B, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    num_blocks = gen_length // block_length
    spb = steps // num_blocks
    cache = TheirCache(net.L, P, prompt_interval_steps, gen_interval_steps, transfer_ratio)
    emb = net.w("model.embed_tokens.weight" if net.dream else "model.transformer.wte.weight")
    head = net.w("lm_head.weight" if net.dream else "model.transformer.ff_out.weight")
    nfe = 0
    for b in range(num_blocks):
        s, e = P + b * block_length, P + (b + 1) * block_length
        ntt = num_transfer_tokens(x[:, s:e] == mask_id, spb)
        for i in range(spb):
            mask_index = x == mask_id
            h = emb[x]
            for layer in range(net.L):
                h = hooked_layer(net, layer, h, cache, trace)
            logits = net.norm(h, "model.norm" if net.dream else "model.transformer.ln_f") @ head.T
            if net.dream:                                     # position p from slot p - 1
                logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
            logits = logits[:, P:]
            nfe += 1
            p = torch.softmax(logits, -1)                     # float64, the mask id included
            if ban_mask:
                logits = logits.clone()
                logits[..., mask_id] = float("-inf")
            x0 = logits.argmax(-1)
            x0_p = p.gather(-1, x0[..., None])[..., 0]
            x0_p[:, (b + 1) * block_length:] = float("-inf")
            x0 = torch.where(mask_index[:, P:], x0, x[:, P:])
            confidence = torch.where(mask_index[:, P:], x0_p, torch.tensor(float("-inf"), dtype=torch.float64))
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(B):
                _, idx = torch.topk(confidence[j], k=int(ntt[j, i]))
                transfer[j, idx] = True
            x[:, P:][transfer] = x0[transfer]
            if record is not None:
                record.append(sorted([r, c + P, int(x0[r, c])] for r, c in transfer.nonzero().tolist()))
    return x, nfe
