"""An independent, deliberately naive transcription of dKV-Cache-Decode on LLaDA (horseee/dKV-Cache
`49a76fc`: `generate` in `generation_utils/llada_dkv_cache_decode.py` and the block forward of
`models/modeling_llada_dkv_cache_decode.py`), written for these tests from docs/accelerators/dkv.md 5.2.

It shares no code with fastdllm's model, cache or engine: the weights are tests/reference.py's
NaiveLM (read from the checkpoint files, float64); the cache is theirs, a separate per-layer pair of
key/value tensors holding *pre-RoPE* projections of the cached positions only, in canvas order,
rotated again at every forward; a cached forward concatenates the fresh keys/values of the
recomputed positions in front of the cached ones (their `torch.cat([k_proj, past_k])`) with the
positions in the same order; selection loops over rows with topk.

Their loop, per block (the cache dropped at its start), for step i of the block's `steps`:
- i == 0: a full forward, nothing cached;
- i == 1 or i % cache_reloading_step == 0: a full forward, then the cache holds the keys/values of
  every position decoded at this forward's input (`transfer_idx[1]`: decoded after step i - 1);
- otherwise: a forward over the positions not decoded at the start of step i - 1 (`~prv_transfer_idx`),
  attending to their fresh keys/values and the cached ones; then the cache holds every position
  decoded at this forward's input, fresh values for the ones just recomputed.
Low-confidence remasking: argmax, float64 softmax probability, -inf after the block, topk of the
fixed schedule per row.

Dream (no LLaDA code of theirs; docs/accelerators/dkv.md 5.2 [U]): the same loop on the shifted family,
with their Dream decoder's `shift_type "un"` rule for what a slot's cache status follows: slot j is
"decoded" when position j + 1 is (their roll, the last slot taking position 0's status), and the
logits at position p are the recomputed slot p - 1's (their refill with -inf, then the shift).

Not theirs, on purpose: `ban_mask` (fastdllm never predicts the mask id; it stays in the softmax).
The authors' batch reshapes each set to (B, -1): rows must have equal counts, so the transcription
runs equal-length prompts, with no padding (their LLaDA code has no attention mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from reference import NaiveLM, confidence_at, num_transfer_tokens


def rope_at(net, x, pos):
    """x (B, H, S, D), pos (B, S): RoPE at each row's own positions (rotate-half layout)."""
    inv = 1.0 / net.theta ** (torch.arange(0, net.D, 2, dtype=torch.float64) / net.D)
    ang = pos.double()[..., None] * inv                     # (B, S, D/2)
    ang = torch.cat([ang, ang], -1)[:, None]                # (B, 1, S, D)
    x1, x2 = x[..., : net.D // 2], x[..., net.D // 2:]
    return x * ang.cos() + torch.cat([-x2, x1], -1) * ang.sin()


def block_forward(net, x, new_pos, past=None, past_pos=None):
    """Their LLaDA forward over the canvas x (B, T) at the positions new_pos (B, n): every layer
    projects q/k/v of those rows; keys/values are [fresh, cached] (past: per layer (k, v) pre-RoPE,
    (B, Hkv, c, D), at past_pos (B, c)). Returns the head's outputs at the rows, unshifted (B, n, V),
    and per layer the fresh pre-RoPE (k, v) of the rows."""
    B, n = new_pos.shape
    ids = x.gather(1, new_pos)
    emb = net.w("model.embed_tokens.weight" if net.dream else "model.transformer.wte.weight")
    h = emb[ids]
    key_pos = new_pos if past is None else torch.cat([new_pos, past_pos], 1)
    fresh = []
    for i in range(net.L):
        names = net.names(i)
        a = net.norm(h, names["n1"])
        q = net.lin(a, names["q"]).view(B, n, net.H, net.D).transpose(1, 2)
        k = net.lin(a, names["k"]).view(B, n, net.Hkv, net.D).transpose(1, 2)
        v = net.lin(a, names["v"]).view(B, n, net.Hkv, net.D).transpose(1, 2)
        fresh.append((k, v))
        if past is not None:
            k, v = torch.cat([k, past[i][0]], 2), torch.cat([v, past[i][1]], 2)
        rep = net.H // net.Hkv
        kr = rope_at(net, k, key_pos).repeat_interleave(rep, 1)
        att = torch.softmax(rope_at(net, q, new_pos) @ kr.transpose(-1, -2) / net.D ** 0.5, -1)
        h = h + net.lin((att @ v.repeat_interleave(rep, 1)).transpose(1, 2).reshape(B, n, -1), names["o"])
        a = net.norm(h, names["n2"])
        h = h + net.lin(F.silu(net.lin(a, names["g"])) * net.lin(a, names["u"]), names["d"])
    h = net.norm(h, "model.norm" if net.dream else "model.transformer.ln_f")
    return h @ net.w("lm_head.weight" if net.dream else "model.transformer.ff_out.weight").T, fresh


def rows_where(flags):
    """(B, T) bool with equal counts per row -> (B, c) positions in canvas order (their nonzero + view)."""
    return torch.nonzero(flags, as_tuple=True)[1].view(flags.shape[0], -1)


def dkv_generate(lm, prompt, *, gen_length, block_length, steps, cache_reloading_step, mask_id,
                 ban_mask=True, record=None, recomputed=None, caches=None):
    """prompt (B, P), equal lengths. Returns (canvas (B, P+G), nfe). `record` gets each step's sorted
    [row, position, token] commits; `recomputed` each step's recomputed positions per row (None for a
    full forward); `caches` each step's cache after it (per layer pre-RoPE (k, v) and positions)."""
    net = NaiveLM(lm)
    B, P = prompt.shape
    T = P + gen_length
    x = torch.full((B, T), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    spb = steps // (gen_length // block_length)
    all_pos = torch.arange(T).expand(B, T)
    nfe = 0

    def decoded(canvas):
        """Their transfer index: a slot is decoded when its logit position is (Dream: their "un" roll)."""
        done = canvas != mask_id
        return torch.cat([done[:, 1:], done[:, :1]], 1) if net.dream else done

    for b in range(gen_length // block_length):
        e = P + (b + 1) * block_length
        ntt = num_transfer_tokens(x[:, e - block_length:e] == mask_id, spb)
        past = past_pos = prv = cur = None
        for i in range(spb):
            mask_index = x == mask_id
            if i % cache_reloading_step != 0 and i > 1:       # cached: the slots not decoded before step i - 1
                new_pos = rows_where(~prv)
                assert torch.equal(past_pos, rows_where(prv))   # the cache holds exactly the rest
                out, fresh = block_forward(net, x, new_pos, past, past_pos)
                # their re-assembly: [fresh, cached] scattered back to canvas order, then the cache keeps `cur`
                keep = rows_where(cur)
                order = torch.cat([new_pos, past_pos], 1)
                kept = []
                for (k, v), (pk, pv) in zip(fresh, past):
                    full_k = torch.zeros(B, net.Hkv, T, net.D, dtype=torch.float64)
                    full_v = torch.zeros_like(full_k)
                    at = order[:, None, :, None].expand(-1, net.Hkv, -1, net.D)
                    full_k.scatter_(2, at, torch.cat([k, pk], 2))
                    full_v.scatter_(2, at, torch.cat([v, pv], 2))
                    sel = keep[:, None, :, None].expand(-1, net.Hkv, -1, net.D)
                    kept.append((full_k.gather(2, sel), full_v.gather(2, sel)))
                past, past_pos = kept, keep
                logits = torch.full((B, T, out.shape[-1]), float("-inf"), dtype=torch.float64)
                logits.scatter_(1, new_pos[..., None].expand(-1, -1, out.shape[-1]), out)
                if recomputed is not None:
                    recomputed.append(new_pos.tolist())
            else:                                              # full: i == 0 (no cache), 1, multiples of R
                logits, fresh = block_forward(net, x, all_pos)
                if i > 0:
                    past_pos = rows_where(cur)
                    sel = past_pos[:, None, :, None].expand(-1, net.Hkv, -1, net.D)
                    past = [(k.gather(2, sel), v.gather(2, sel)) for k, v in fresh]
                if recomputed is not None:
                    recomputed.append(None)
            nfe += 1
            if caches is not None:
                caches.append((past, past_pos))
            # their float64 softmax over the full vocabulary (mask id included), -inf after the block;
            # taken at the block's positions only, the only ones with a mask (earlier blocks are done)
            s = e - block_length
            assert not mask_index[:, :s].any()
            block = logits[:, s - 1:e - 1] if net.dream else logits[:, s:e]   # Dream: position p from slot p - 1
            x0, confidence = x.clone(), torch.full(x.shape, float("-inf"), dtype=torch.float64)
            x0[:, s:e], confidence[:, s:e] = confidence_at(block, mask_index[:, s:e], x[:, s:e], mask_id, ban_mask,
                                                           "prob")
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(B):
                _, idx = torch.topk(confidence[j], k=int(ntt[j, i]))
                transfer[j, idx] = True
            x[transfer] = x0[transfer]
            if record is not None:
                record.append(sorted([r, c, int(x[r, c])] for r, c in transfer.nonzero().tolist()))
            prv, cur = cur, decoded(x)
    return x, nfe
