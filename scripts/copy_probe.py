"""Does a built-in checkpoint read its prompt? Leave-one-out accuracy on held-out word problems.

For each of the first N `tiny-gsm` problems, the worked answer is given whole but for one token,
masked; the model's argmax at that position is compared with the token. Reported twice: over all
answer tokens, and over the tokens that copy the question (its names, things and each number's
digits), which a model that never looks the question up gets right only by chance. The second
session's checkpoint (docs/builtin-model-training.md) scored 0.6-0.7 overall and wrote the same
name whatever the question's was.

    python scripts/copy_probe.py runs/tiny-llada/export [--problems 24]
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--problems", type=int, default=24)
    args = parser.parse_args()
    result = probe(args.model_dir, args.problems)
    print(f"leave-one-out accuracy on {args.problems} tiny-gsm answers: all tokens {result['all']:.3f}, "
          f"tokens copied from the question {result['copied']:.3f}")


if __name__ == "__main__":
    main()
