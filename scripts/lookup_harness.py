#!/usr/bin/env python3
"""A small model on a chosen share of tiny-llada's rows, with the copy probe every few hundred steps:
minutes per try, to find which data, masks and optimiser settings make a model read its prompt
before spending hours of the built-in model's training on them (docs/builtin-model-training.md).

    python scripts/lookup_harness.py --weights gsm_raw:1 --rows 96:1 --steps 600
    python scripts/lookup_harness.py --weights mixture --rows 128:0.55,192:0.37,512:0.08

Uses the tokenizer of runs/tiny-llada (trained by scripts/train_tiny.py --recipe tiny-llada).
Prints one line per probe: step, training loss, probe accuracy over all answer tokens / copied tokens.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from copy_probe import probe_model  # noqa: E402
from fastdllm.models import LLaDAConfig, LLaDAModelLM  # noqa: E402
from fastdllm.training import data, mixture, story_words, tokenizer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="gsm_raw:1")
    parser.add_argument("--rows", default="96:1")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--block-share", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--probe-every", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--novel-share", type=float, default=story_words.NOVEL_SHARE,
                        help="share of training names and things that are made-up words")
    parser.add_argument("--tokenizer", default=str(ROOT / "runs/tiny-llada/tokenizer/tokenizer.json"))
    args = parser.parse_args()

    story_words.NOVEL_SHARE = args.novel_share
    tok = tokenizer.Tokenizer.from_file(args.tokenizer)
    ids = {t: tok.token_to_id(t) for t in tokenizer.SPECIALS}
    weights = mixture.weights_of(args.weights)
    stream, functions = torch.zeros(4096, dtype=torch.long), []
    if {"stdlib_window", "stdlib_function"} & set(weights):
        texts = [data.read(p) for p in data.corpus_files()[0]]
        stream = torch.tensor([i for enc in tok.encode_batch(texts) for i in enc.ids + [ids[tokenizer.EOS]]])
        functions = [f for text in texts for f in data.functions(text)]
    rows = mixture.Mixture(tok, stream, functions, ids, mixture.shares(args.rows), weights)
    vocab = tok.get_vocab_size()
    config = LLaDAConfig(d_model=args.d_model, n_heads=args.d_model // 32, n_kv_heads=args.d_model // 32,
                         n_layers=args.layers, mlp_hidden_size=3 * args.d_model, vocab_size=vocab,
                         embedding_size=vocab, max_sequence_length=1024, rope_theta=10000.0,
                         mask_token_id=ids[tokenizer.MASK], eos_token_id=ids[tokenizer.EOS],
                         pad_token_id=ids[tokenizer.EOS], bos_token_id=ids[tokenizer.BOS])
    torch.manual_seed(args.seed)
    model = LLaDAModelLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng, start = random.Random(args.seed), time.perf_counter()
    for step in range(1, args.steps + 1):
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, step / 20)
        tokens, prompt = rows.batch(args.batch, rng)
        noisy, _, weight = mixture.block_mask_batch(tokens, prompt, ids[tokenizer.MASK], rng, args.block_share)
        loss = data.forward_loss(model, noisy, tokens, weight, prompt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.probe_every == 0:
            model.eval()
            result = probe_model(model, lambda text: tok.encode(text).ids, tok.decode, 24)
            model.train()
            print(f"step {step} loss {loss.item():.3f} probe all {result['all']:.3f} copied {result['copied']:.3f} "
                  f"({(time.perf_counter() - start) / 60:.1f} min)", flush=True)


if __name__ == "__main__":
    main()
