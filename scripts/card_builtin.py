"""The tiny-llada model card, written by scripts/eval_builtin.py from what it measured."""

from __future__ import annotations

from pathlib import Path


def write_card(model: Path, figures: dict, held_out: str, marker: str) -> None:
    card = model / "README.md"
    kept = card.read_text().split(marker, 1)[1] if card.is_file() and marker in card.read_text() else "\n"
    f = figures["facts"]
    c, s = f["config"], f["state"]
    tc = s.get("train_config", {})
    runs = "\n".join(f"    python scripts/train_tiny.py {cmd}" for cmd in s.get("commands", []))
    history = ", ".join(f"step {h['step']}: {h['heldout_loss']:.3f}" for h in s.get("history", [])[-8:])
    tables = "\n\n".join(f"`{shown}` ({seconds / 60:.1f} min)\n\n{text.strip()}" for shown, text, seconds in figures["tables"])
    commands = "\n\n".join(f"`{shown}` ({seconds:.1f} s, load included)\n\n```text\n{text.strip()}\n```"
                           for shown, text, seconds in figures["commands"])
    text = f"""# tiny-llada: fastdllm's built-in word-problem and function model

A masked-diffusion model of {f['params'] / 1e6:.1f}M parameters in LLaDA's published format, trained from
scratch by scripts in this repository to solve short grade-school word problems step by step
(GSM8K's format, `#### 42`), to write small Python functions from a signature and docstring
(HumanEval's shape) and to continue Python source; the tables below say how often it gets them
right. It exists to make fastdllm's decoding settings measurable on a machine without a hub:
every row is accuracy on held-out tasks beside speed. It is a demonstration model, not an
assistant: outside these kinds of task it answers nonsense.

## Architecture and size

LLaDA architecture, loaded through the same code path as LLaDA-8B: d_model {c['d_model']}, {c['n_layers']} layers,
{c['n_heads']} heads, MLP {c['mlp_hidden_size']}, vocabulary {c['vocab_size']} (byte-level BPE, every digit a token of
its own), RoPE theta {c['rope_theta']}; {f['params']:,} parameters, bf16 on disk, {f['bytes'] / 2**20:.1f} MiB
in all. Mask id {c['mask_token_id']} (`<|mdm_mask|>`), end of text {c['eos_token_id']}; LLaDA-8B-Instruct's
chat template (`<|eot_id|>` ends a turn), so `chat` and `serve` work on it.

## Data

Drawn fresh at every step from generators in `fastdllm/training/` (no row is seen twice; no
download): word problems with worked steps (`word_problems.py`), function tasks with tests
(`function_tasks.py`; a few classics such as `fibonacci` are training-only), both raw and in the
chat template; rows of bare arithmetic facts of the kinds the worked steps use (`57 * 3 = 171`,
every number allowed, those of the held-out band too: the skill the held-out problems share by
design); and the Python standard library's source (tests and 8 modules left out) as windows
for plain continuation and as signature -> body pairs (`mixture.py` gives the shares). Answers are
padded with end-of-text to the row end, as LLaDA's SFT pads them. Rows are masked as LLaDA trains
and, for half the rows with a prompt, in the state block-wise decoding meets (earlier blocks clean,
one block partly masked, the rest masked).

Held-out sets (the graded tasks `fastdllm eval` finds without `--include-path`):

{held_out}

## Training

{s.get('step', 0):,} steps, {s.get('tokens', 0):,} tokens (padding included), {s.get('wall_seconds', 0) / 3600:.2f} h of wall
time in {s.get('runs', 1)} run(s) on {figures['machine']} (shared with other work).
AdamW (lr {tc.get('lr')}, betas 0.9/0.95, weight decay {tc.get('weight_decay')}), batch {tc.get('batch_size')} rows,
bf16 autocast, seed {tc.get('seed')}; each run warms up, holds the rate, and decays it linearly over its
last {tc.get('decay_minutes')} minutes. The commands, in order:

{runs}

Held-out loss (fixed tiny-gsm / tiny-code rows, t from 0.05 to 1): {history}.

## The paper's Table 1 on this model

Measured by `python scripts/eval_builtin.py {model.name} --write-card` on {figures['machine']}.
Each row decodes every held-out document; `tok/fwd` counts answer tokens per forward, tokens/s
counts answer tokens, the speed-up is against the baseline row at the same length.

{tables}

## The signature commands

{commands}
"""
    card.write_text(text + "\n" + marker + kept)
