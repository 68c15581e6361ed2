"""An independent float64 transcription of iLLaDA's forward (docs/specs/illada.md 1.3) and of its authors'
decoding (ML-GSAI/LLaDA generate.py at 9182493: `generate`, `var_generate` and the end-of-thinking
boost; docs/specs/illada.md 3.1-3.4), written for these tests from that spec.

It shares no code with fastdllm: the weights are read from the checkpoint's safetensors by their
names; every step is one plain forward of the whole sequence (no cache, no attention mask, RoPE
positions 0..L-1); the schedule is LLaDA's get_num_transfer_tokens; confidences are a float64
softmax over the whole vocabulary; selection is topk per row; in var mode the sequence really grows
by one block of masks per call. One known difference is a switch:

- ban_mask: fastdllm never predicts the mask id (the authors' argmax may; their loop then never
  ends). Both agree wherever the mask is not the argmax.

The stop test between blocks is on ids (a stop id among the generated tokens), where the authors
test text for stop strings (docs/specs/illada.md 7.3).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


class NaiveILLaDA:
    """The Llama-layout bidirectional decoder, in float64, from the files alone."""

    def __init__(self, folder: Path):
        folder = Path(folder)
        self.w = {}
        for shard in sorted(folder.glob("*.safetensors")):
            self.w.update({k: v.double() for k, v in load_file(str(shard)).items()})
        c = json.loads((folder / "config.json").read_text())
        self.layers, self.heads, self.kv_heads = c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
        self.dim = c["hidden_size"] // self.heads
        self.theta, self.eps = c["rope_theta"], c["rms_norm_eps"]
        # the head: lm_head.weight unless tied, or when the shards lack it (docs/specs/illada.md 7.1)
        tied = c.get("tie_word_embeddings", True) or "lm_head.weight" not in self.w
        self.head = self.w["model.embed_tokens.weight"] if tied else self.w["lm_head.weight"]

    def norm(self, x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[name + ".weight"]

    def rotate(self, x):                       # x (B, H, L, D), positions 0..L-1, rotate-half
        L, D = x.shape[2], self.dim
        inv = self.theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        angle = torch.arange(L, dtype=torch.float64)[:, None] * inv[None, :]     # (L, D/2)
        cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
        half = torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)
        return x * cos + half * sin

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, L) -> logits (B, L, V) at every position (no shift)."""
        B, L = ids.shape
        x = self.w["model.embed_tokens.weight"][ids]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            h = self.norm(x, p + "input_layernorm")
            q, k, v = (h @ self.w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
            q = self.rotate(q.view(B, L, self.heads, self.dim).transpose(1, 2))
            k = self.rotate(k.view(B, L, self.kv_heads, self.dim).transpose(1, 2))
            v = v.view(B, L, self.kv_heads, self.dim).transpose(1, 2)
            group = self.heads // self.kv_heads
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.dim), -1)      # no mask at all
            x = x + (att @ v).transpose(1, 2).reshape(B, L, -1) @ self.w[p + "self_attn.o_proj.weight"].T
            h = self.norm(x, p + "post_attention_layernorm")
            gate, up = h @ self.w[p + "mlp.gate_proj.weight"].T, h @ self.w[p + "mlp.up_proj.weight"].T
            x = x + (F.silu(gate) * up) @ self.w[p + "mlp.down_proj.weight"].T
        return self.norm(x, "model.norm") @ self.head.T


def num_transfer_tokens(block_mask: torch.Tensor, steps: int) -> torch.Tensor:
    """LLaDA's get_num_transfer_tokens: (B, L) -> (B, steps), the remainder to the first steps."""
    counts = block_mask.sum(1, keepdim=True)
    out = (counts // steps).repeat(1, steps)
    for row in range(out.shape[0]):
        out[row, :int(counts[row, 0] % steps)] += 1
    return out


def holds(seq: list[int], run: list[int]) -> bool:
    return any(seq[i:i + len(run)] == run for i in range(len(seq) - len(run) + 1))


def end_think_boost(logits, x, s, e, think: dict, mask_id: int) -> None:
    """docs/specs/illada.md 3.4, in place on logits (B, L, V); think: ids S, start c, length T, boost, power."""
    S, c = think["ids"], think["start"]
    for row in range(x.shape[0]):
        if holds(x[row, c:].tolist(), S):
            continue
        masked = [j for j in range(s, e) if int(x[row, j]) == mask_id]
        if not masked:
            continue
        p = masked[0]
        r = min(max((p - c + 1) / think["length"], 0.0), 1.0)
        token = S[0]
        for k in range(min(len(S) - 1, p - c), 0, -1):
            if x[row, p - k:p].tolist() == S[:k]:
                token = S[k]
                break
        logits[row, p, token] += think["boost"] * r ** think["power"]


def generate(net, prompt, *, steps, gen_length, block_length, mask_id, think=None, ban_mask=True):
    """LLaDA's generate as iLLaDA's authors call it (temperature 0, low_confidence, cfg 0):
    prompt (B, P) -> (x (B, P + gen_length), forwards)."""
    B, P = prompt.shape
    x = torch.cat([prompt, torch.full((B, gen_length), mask_id, dtype=torch.long)], 1)
    assert gen_length % block_length == 0
    blocks = gen_length // block_length
    assert steps % blocks == 0
    per_block, nfe = steps // blocks, 0
    for b in range(blocks):
        s, e = P + b * block_length, P + (b + 1) * block_length
        k = num_transfer_tokens(x[:, s:e] == mask_id, per_block)
        for i in range(per_block):
            mask_index = x == mask_id
            logits = net.logits(x)
            nfe += 1
            if think is not None:
                end_think_boost(logits, x, s, e, think, mask_id)
            scored = logits.clone()
            if ban_mask:
                scored[..., mask_id] = float("-inf")
            x0 = scored.argmax(-1)
            p = torch.softmax(logits, -1).gather(-1, x0[..., None])[..., 0]
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, p, torch.tensor(float("-inf"), dtype=torch.float64))
            confidence[:, e:] = float("-inf")
            for row in range(B):
                _, chosen = torch.topk(confidence[row], k=int(k[row, i]))
                x[row, chosen] = x0[row, chosen]
    return x, nfe


def var_generate(net, prompt, *, steps, gen_length, block_length, mask_id, stops=(), think=None, ban_mask=True):
    """var_generate: one block of masks appended at a time, `steps` forwards for it; stop between
    blocks once a stop id stands among the generated tokens. think: the boost's S, B, power (its
    start and length are the original prompt's end and gen_length). -> (x, forwards)."""
    P = prompt.shape[1]
    if think is not None:
        think = dict(think, start=P, length=gen_length)
    x, nfe = prompt, 0
    for _ in range(gen_length // block_length):
        x, n = generate(net, x, steps=steps, gen_length=block_length, block_length=block_length, mask_id=mask_id,
                        think=think, ban_mask=ban_mask)
        nfe += n
        if any(int(t) in stops for t in x[0, P:]):
            break
    return x, nfe


def fixed_generate(net, prompt, *, steps, gen_length, block_length, mask_id, think=None, ban_mask=True):
    """var off: the whole canvas at once (steps in all), the boost over the same region."""
    if think is not None:
        think = dict(think, start=prompt.shape[1], length=gen_length)
    return generate(net, prompt, steps=steps, gen_length=gen_length, block_length=block_length, mask_id=mask_id,
                    think=think, ban_mask=ban_mask)
