"""An independent float64 transcription of LLaDA2.2's insert/delete (InDel) decoder as
docs/specs/llada2-2.md §3 states it (SGLang's JointThresholdInDel as first proposed, with the released
generate's post-edit boundary and a later version's budget 0 and step cap), written for these
tests, greedy only, batch 1, no cache.

Per block on the absolute grid (from the block holding the prompt's end); at the block's start
`prompt` = its non-mask positions, `orig` = its masks; per step:
  1. forward x[:block end] (block-causal); x0, p per block position (mask id banned)
  2. masks; n_orig = masks still flagged original, n_new = the others
  3. M2T: n_orig > 0: need = 1 + n_new masks: all with p > threshold if that many, else the `need`
     most confident; n_orig == 0: every mask
  4. n_orig == 0: post += 1; force-finish when post >= max_post_steps (budget 0: at the first such
     step, or at the step whose M2T takes every original mask left), or when the step count exceeds
     block_size + max_post_steps (the cap); force-finish: every mask is written, DELETE/SPLIT
     predictions become the best other token (p stays the probability of the first choice, as in ID-0)
  5. T2T: not mask, not prompt, x0 != current, p > edit_threshold
  6. nothing to write: the block ends ("done")
  7. anti-loop: the pre-write state seen before (not force-finish): the lowest-p changing position
     takes its best token not yet written there in this block
  8. write; 9. edits left to right: DELETE dropped, SPLIT -> [MASK (introduced), the position's
     pre-write token (its flag)], cut / padded with introduced masks to the block size
  10. a force-finish step ends the block ("forced", or "capped" when the cap forced it)

Shares no code with fastdllm: the model is reference_moe.NaiveLLaDA2.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from reference_moe import BANNED


@dataclass
class InDelStep:
    block: int
    committed: list          # sorted [(block offset, token)] masks written (M2T), before the edits
    edited: list             # sorted [(block offset, token)] tokens overwritten (T2T), before the edits
    deleted: list            # block offsets where a DELETE was written
    split: list              # block offsets where a SPLIT was written
    looped: int | None       # the anti-loop position, if the rule fired
    forced: bool
    after: list              # the block's tokens after the edits


@dataclass
class InDelTrace:
    tokens: list = field(default_factory=list)
    canvas: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    ends: dict = field(default_factory=dict)          # block -> "done" | "forced" | "capped" (the step cap)
    blocks: list = field(default_factory=list)
    nfe: int = 0                                       # forwards, the last one of a "done" block included


def _ranked(logits_row, excluded=()):
    """The best token id of one position's logits, excluding BANNED and `excluded`."""
    row = logits_row.clone()
    for t in list(BANNED) + list(excluded):
        row[t] = -float("inf")
    return int(torch.argmax(row))


def indel_generate(naive, prompt, *, mask_id, eos_id, delete_id, split_id, gen_length, block_length=32,
                   threshold=0.5, edit_threshold=0.0, max_post_steps=16) -> InDelTrace:
    B, L = block_length, len(prompt)
    nb = -(-(L + gen_length) // B)
    x = list(prompt) + [mask_id] * (nb * B - L)
    tr = InDelTrace()
    for b in range(L // B, nb):
        s, e = b * B, (b + 1) * B
        tr.blocks.append(b)
        prompt_at = [x[j] != mask_id for j in range(s, e)]
        orig = [not q for q in prompt_at]
        post, seen, history, step = 0, set(), {}, 0
        while True:
            logits = naive.forward(x[:e], "block-causal", block_length=B, rows=range(s, e))
            tr.nfe += 1
            probs = torch.softmax(logits, -1)
            x0 = [_ranked(logits[i]) for i in range(B)]
            p = [float(probs[i, x0[i]]) for i in range(B)]
            cur = x[s:e]
            masked = [i for i in range(B) if cur[i] == mask_id]
            n_orig = sum(orig[i] for i in masked)
            n_new = len(masked) - n_orig
            if n_orig > 0:
                need = 1 + n_new
                hi = [i for i in masked if p[i] > threshold]
                m2t = hi if len(hi) >= need else sorted(masked, key=lambda i: (-p[i], i))[:min(need, len(masked))]
            else:
                m2t = list(masked)
            step += 1
            if n_orig == 0:
                post += 1
            capped = step > B + max_post_steps
            forced = (n_orig == 0 and post >= max_post_steps) or capped or (
                max_post_steps == 0 and n_orig > 0 and not [i for i in masked if orig[i] and i not in m2t])
            if forced:
                m2t = list(masked)                                       # every mask written
                x0 = [_ranked(logits[i], (delete_id, split_id)) if x0[i] in (delete_id, split_id) else x0[i]
                      for i in range(B)]                                 # p stays the first choice's (ID-0)
            t2t = [i for i in range(B) if cur[i] != mask_id and not prompt_at[i] and x0[i] != cur[i]
                   and p[i] > edit_threshold]
            write = sorted(set(m2t) | set(t2t))
            if not write:
                tr.ends[b] = "done"
                break
            key, looped = tuple(cur), None
            if key in seen and not forced:
                changing = [i for i in write if x0[i] != cur[i]]
                if changing:
                    looped = min(changing, key=lambda i: (p[i], i))
                    x0[looped] = _ranked(logits[looped], history.get(looped, ()))
            seen.add(key)
            for i in write:
                history.setdefault(i, set()).add(x0[i])
            new = list(cur)
            for i in write:
                new[i] = x0[i]
            tokens, flags = [], []
            for i in range(B):
                if new[i] == delete_id:
                    continue
                if new[i] == split_id:
                    tokens += [mask_id, cur[i]]
                    flags += [False, orig[i]]
                else:
                    tokens.append(new[i])
                    flags.append(orig[i])
            tokens, flags = tokens[:B], flags[:B]
            tokens += [mask_id] * (B - len(tokens))
            flags += [False] * (B - len(flags))
            x[s:e], orig = tokens, flags
            tr.steps.append(InDelStep(b, sorted((i, x0[i]) for i in m2t), sorted((i, x0[i]) for i in t2t),
                                      [i for i in write if new[i] == delete_id],
                                      [i for i in write if new[i] == split_id], looped, forced, list(tokens)))
            if forced:
                tr.ends[b] = "capped" if capped else "forced"
                break
    tr.canvas = list(x)
    out = x[L:L + gen_length]
    tr.tokens = out[:out.index(eos_id) + 1] if eos_id in out else out
    return tr
