"""An independent float64 transcription of LLaDA2.1's decoder with token editing (the checkpoint's
own `generate`, docs/specs/llada2-editing.md §1), written for these tests from the docs, greedy only:

per block on the absolute grid (from the block holding the prompt's end), loop without a step cap:
  1. if the block has no mask: one more post-fill round; past `max_post_steps` of them, the block ends
  2. forward the window x[:block end] under the block-causal mask, no cache
  3. M2T: masks with p > threshold, or (if fewer than num_to_transfer) the most confident masks
  4. T2T: written, non-prompt positions of the block whose argmax differs and p > edit_threshold
  5. write both
  6. the block ends when the step began with no mask and edited nothing
Output: x[L : L + gen_length], cut after the first eos; `eos_early_stop` only after a block.

Shares no code with fastdllm: the model is reference_moe.NaiveLLaDA2 (and its `greedy`, which
bans reference_moe.BANNED ids as fastdllm bans the mask id).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reference_moe import greedy, most_confident


@dataclass
class Step:
    block: int
    post: bool                   # a post-fill round: the step began with no mask in the block
    committed: list              # sorted [(pos, token)] masks written (M2T)
    edited: list                 # sorted [(pos, token)] written tokens overwritten (T2T)
    was: dict                    # pos -> the token an edit replaced


@dataclass
class EditTrace:
    tokens: list = field(default_factory=list)       # answer after the prompt, cut after the first eos
    canvas: list = field(default_factory=list)       # final x (prompt included)
    steps: list = field(default_factory=list)        # one Step per forward
    ends: dict = field(default_factory=dict)         # block -> "no-change" | "budget"
    blocks: list = field(default_factory=list)       # blocks decoded (absolute index)

    @property
    def nfe(self) -> int:
        return len(self.steps)

    @property
    def edits(self) -> int:
        return sum(len(s.edited) for s in self.steps)

    def stores(self, block_length: int) -> int:
        """Forwards a block-causal cache adds (docs §3): the prompt's whole blocks once, and every
        decoded block but the last whose last forward was followed by a write (it ended on the
        budget: its keys/values must be recomputed); a no-change exit's forward saw it final."""
        prefill = self.blocks[0] > 0 if self.blocks else False
        return int(prefill) + sum(self.ends[b] == "budget" for b in self.blocks[:-1])


def editing_generate(naive, prompt, *, mask_id, eos_id, gen_length, block_length=32, threshold=0.95,
                     edit_threshold=0.9, max_post_steps=16, num_to_transfer=1,
                     eos_early_stop=False) -> EditTrace:
    B, L = block_length, len(prompt)
    nb = -(-(L + gen_length) // B)
    x = list(prompt) + [mask_id] * (nb * B - L)
    tr = EditTrace()
    for b in range(L // B, nb):
        start, end = b * B, (b + 1) * B
        tr.blocks.append(b)
        post = 0
        while True:
            old = x[start:end]
            masked = [j for j in range(start, end) if x[j] == mask_id]
            if not masked:
                post += 1
            if post > max_post_steps:
                tr.ends[b] = "budget"
                break
            logits = naive.forward(x[:end], "block-causal", block_length=B, rows=range(start, end))
            x0, p = greedy(logits)
            conf = {j: p[j - start] for j in masked}
            hi = [j for j in masked if conf[j] > threshold]
            m2t = hi if len(hi) >= num_to_transfer else most_confident(masked, conf, min(num_to_transfer, len(masked)))
            t2t = [j for j in range(max(start, L), end)                       # never the prompt
                   if x[j] != mask_id and p[j - start] > edit_threshold and x0[j - start] != old[j - start]]
            for j in m2t + t2t:
                x[j] = x0[j - start]
            tr.steps.append(Step(b, not masked, sorted((j, x[j]) for j in m2t), sorted((j, x[j]) for j in t2t),
                                 {j: old[j - start] for j in t2t}))
            if not masked and not t2t:
                tr.ends[b] = "no-change"
                break
        if eos_early_stop and mask_id not in x[L:end] and eos_id in x[L:end]:
            break
    tr.canvas = list(x)
    out = x[L:L + gen_length]
    tr.tokens = out[:out.index(eos_id) + 1] if eos_id in out else out
    return tr
