#!/usr/bin/env python3
"""How fast a small model in the built-in model's format learns to copy: N random tokens, a
separator, the same N tokens masked as tiny-llada's training masks them (mixture.block_mask_batch,
uniform t), the loss of data.forward_loss weighted 1/t (LLaDA's) or flat; every 100 steps the
accuracy of one step on the second copy, fully masked and with one token masked (what a
previous-token lookup can answer). One thread, seeded: minutes on a CPU.

    python scripts/copy_task.py --loss-weight elbo     # 2026-12-07, AVX2 CPU: 0.022 after 400 steps
    python scripts/copy_task.py --loss-weight flat     #                       0.130 after 400 steps
    python scripts/copy_task.py --loss-weight flat --min-tokens 8 --tokens 32 --copy-vocab 20 --steps 1500
        # lengths 8-32, ten symbols: one masked 0.73, all masked 0.43 at step 1,500 (chance 0.1);
        # --copy-vocab 42 or 4096: chance at step 800 and 600 (eighth session)
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastdllm.models import LLaDAConfig, LLaDAModelLM  # noqa: E402
from fastdllm.training import data, mixture  # noqa: E402

VOCAB, MASK, SEP, EOS = 4096, 5, 6, 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loss-weight", choices=("elbo", "flat"), default="elbo")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=16, help="length of the copied sequence (the longest)")
    ap.add_argument("--min-tokens", type=int, default=0, help="draw each row's length from min..tokens "
                    "(the repeat rows' 8-64), end-of-text padded; default: every row --tokens long")
    ap.add_argument("--mask", choices=("copy", "both"), default="copy",
                    help="copy: only the second copy masked; both: every token (as repeat rows are)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--copy-vocab", default=str(VOCAB),
                    help="copied tokens drawn from ids 10..this; a list (20,266,4096): each row draws one, "
                         "and the accuracy is shown for the first and the last")
    ap.add_argument("--tie", action="store_true", help="weight_tying: the head is the embedding")
    args = ap.parse_args()
    torch.set_num_threads(1)
    d, n = args.d_model, args.tokens
    config = LLaDAConfig(d_model=d, n_heads=d // 32, n_kv_heads=d // 32, n_layers=args.layers, mlp_hidden_size=3 * d,
                         vocab_size=VOCAB, embedding_size=VOCAB, max_sequence_length=1024, rope_theta=10000.0,
                         mask_token_id=MASK, eos_token_id=1, pad_token_id=1, bos_token_id=0,
                         weight_tying=args.tie)
    torch.manual_seed(0)
    model = LLaDAModelLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng, start = random.Random(0), time.perf_counter()

    alphabets = [int(v) for v in args.copy_vocab.split(",")]

    def batch(rows: int, lengths: list[int], alphabet: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, 2n+1) copies of lengths[r] tokens, end-of-text padded; prompt = first copy + separator."""
        out = torch.full((rows, 2 * n + 1), EOS)
        for r, k in enumerate(lengths):
            x = torch.randint(10, alphabet or rng.choice(alphabets), (k,))
            out[r, :2 * k + 1] = torch.cat([x, torch.tensor([SEP]), x])
        return out, torch.tensor([k + 1 for k in lengths])

    def lengths(rows: int) -> list[int]:
        return [rng.randint(args.min_tokens, n) if args.min_tokens else n for _ in range(rows)]

    def accuracy(all_masked: bool, alphabet: int, rows: int = 128) -> float:
        """Second-copy accuracy: the whole copy masked, or one random token of it."""
        k = lengths(rows)
        tokens, prompt = batch(rows, k, alphabet)
        noisy, where = tokens.clone(), torch.zeros_like(tokens, dtype=torch.bool)
        for r in range(rows):
            lo = int(prompt[r])
            if all_masked:
                where[r, lo:lo + k[r]] = True
            else:
                where[r, lo + rng.randrange(k[r])] = True
        noisy[where] = MASK
        with torch.no_grad():
            return (model(noisy).logits.argmax(-1)[where] == tokens[where]).float().mean().item()


    for step in range(1, args.steps + 1):
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, step / 20)
        tokens, prompt = batch(args.batch, lengths(args.batch))
        prompt = prompt if args.mask == "copy" else torch.zeros_like(prompt)
        noisy, masked, weight = mixture.block_mask_batch(tokens, prompt, MASK, rng, block_share=0.0)
        if args.loss_weight == "flat":
            weight = masked.float()
        loss = data.forward_loss(model, noisy, tokens, weight, prompt)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            shown = ", ".join(f"alphabet {a - 10}: all masked {accuracy(True, a):.3f}, one masked {accuracy(False, a):.3f}"
                              for a in sorted({alphabets[0], alphabets[-1]}))
            print(f"step {step} loss {loss.item():.3f} copy accuracy {shown} ({time.perf_counter() - start:.0f} s)",
                  flush=True)


if __name__ == "__main__":
    main()
