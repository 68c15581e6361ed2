"""Does a built-in checkpoint read its prompt? Leave-one-out accuracy on held-out word problems.

For each of the first N `tiny-gsm` problems, the worked answer is given whole but for one token,
masked; the model's argmax at that position is compared with the token. Reported twice: over all
answer tokens, and over the tokens that copy the question (its names, things and each number's
digits), which a model that never looks the question up gets right only by chance. The second
session's checkpoint (docs/builtin-model-training.md) scored 0.6-0.7 overall and wrote the same
name whatever the question's was.

Then the plainest lookup, on rows the training's "repeat" kind draws: 24 random digits (then 24
random ordinary tokens), a newline, the same 24 tokens; the second copy's tokens predicted one masked at a time, then all
masked at once. Nothing but the first copy predicts them: near 0 means no lookup at all.

    python scripts/copy_probe.py runs/tiny-llada/export [--problems 24]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

import torch

from fastdllm.eval.builtin_tasks import __file__ as tasks_init
from fastdllm.models import LLaDAModelLM
from fastdllm.training import mixture


def copied_positions(decode, question: str, answer_ids: list[int]) -> list[int]:
    """Answer positions whose token is one of the question's words or one of its numbers' digits."""
    words = set(re.findall(r"[A-Za-z]+", question)) - {"How", "What", "If", "The", "Each", "In"}
    digits = set("".join(re.findall(r"\d+", question)))
    keep = []
    for k, t in enumerate(answer_ids):
        piece = decode([t]).strip()
        if piece and (piece in words or (piece.isdigit() and piece in digits)):
            keep.append(k)
    return keep


def probe(model_dir: str, problems: int) -> dict[str, float]:
    from transformers import AutoTokenizer
    model = LLaDAModelLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    return probe_model(model, lambda text: tok(text, add_special_tokens=False)["input_ids"], tok.decode, problems)


def probe_model(model, encode, decode, problems: int) -> dict[str, float]:
    """The probe on a model in memory; encode(text) -> ids without special tokens, decode(ids) -> text."""
    mask, eos = model.config.mask_token_id, model.config.eos_token_id
    data = Path(tasks_init).parent / "tiny_gsm.jsonl"
    hits = {"all": [0, 0], "copied": [0, 0]}
    for line in data.read_text().splitlines()[:problems]:
        doc = json.loads(line)
        prompt = encode(mixture.gsm_prompt(doc["question"]))
        answer = encode(" " + doc["answer"])
        row = prompt + answer + [eos] * 8
        rows = torch.tensor([row] * len(answer))
        for k in range(len(answer)):
            rows[k, len(prompt) + k] = mask
        with torch.no_grad():
            guess = model(rows).logits[torch.arange(len(answer)), len(prompt) + torch.arange(len(answer))].argmax(-1)
        right = (guess == torch.tensor(answer)).tolist()
        copied = copied_positions(decode, doc["question"], answer)
        hits["all"][0] += sum(right)
        hits["all"][1] += len(right)
        hits["copied"][0] += sum(right[k] for k in copied)
        hits["copied"][1] += len(copied)
    return {name: a / max(1, n) for name, (a, n) in hits.items()}


def repeat_probe(model, encode, alphabet: list[int], rows: int = 12, n: int = 24) -> dict[str, float]:
    """Accuracy on the second copy of `rows` random repeats of `alphabet`'s tokens: one token masked
    at a time, all masked."""
    mask, eos = model.config.mask_token_id, model.config.eos_token_id
    newline, rng, hits = encode("\n"), random.Random(0), {"one masked": 0, "all masked": 0}
    for _ in range(rows):
        seq = [rng.choice(alphabet) for _ in range(n)]
        row, start = seq + newline + seq + [eos] * 8, n + len(newline)
        canvas = torch.tensor([row] * (n + 1))
        for k in range(n):
            canvas[k, start + k] = mask
        canvas[n, start:start + n] = mask                       # the last row: the whole copy masked
        with torch.no_grad():
            logits = model(canvas).logits
        one = logits[torch.arange(n), start + torch.arange(n)].argmax(-1)
        every = logits[n, start:start + n].argmax(-1)
        hits["one masked"] += int((one == torch.tensor(seq)).sum())
        hits["all masked"] += int((every == torch.tensor(seq)).sum())
    return {k: v / (rows * n) for k, v in hits.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--problems", type=int, default=24)
    args = parser.parse_args()
    result = probe(args.model_dir, args.problems)
    print(f"leave-one-out accuracy on {args.problems} tiny-gsm answers: all tokens {result['all']:.3f}, "
          f"tokens copied from the question {result['copied']:.3f}")
    from transformers import AutoTokenizer
    model = LLaDAModelLM.from_pretrained(args.model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]      # noqa: E731
    for name, size in (("digits", 10), ("any tokens", 0)):
        alphabet = mixture.repeat_alphabet(tok.backend_tokenizer, set(tok.all_special_ids), size)
        repeats = repeat_probe(model, encode, alphabet)
        print(f"random repeats of {name} (24 tokens, 12 rows): second copy one token masked "
              f"{repeats['one masked']:.3f}, all masked {repeats['all masked']:.3f}")


if __name__ == "__main__":
    main()
