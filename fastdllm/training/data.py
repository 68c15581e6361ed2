"""The corpus (Python standard library source, tests excluded, a few modules held out) and the
masked-diffusion training batches built from it."""

from __future__ import annotations

import ast
import sysconfig
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..models import cpu

# Whole modules kept out of training (and out of the tokenizer) for evaluation.
HELD_OUT = ("textwrap", "fractions", "shlex", "heapq", "bisect", "colorsys", "graphlib", "statistics")
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def corpus_files(root: Path | None = None) -> tuple[list[Path], list[Path]]:
    """(training files, held-out files) under the stdlib of the interpreter running this."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if not _SKIP_DIRS & set(p.relative_to(root).parts[:-1]) and not p.name.startswith("test_"))
    held = [p for p in files if p.parent == root and p.stem in HELD_OUT]
    return [p for p in files if p not in held], held


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def functions(source: str) -> list[tuple[str, str]]:
    """(header, body) of every function in `source`, dedented: the header runs from `def` to the
    line before the first statement of the body (signature only), the body is the rest."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines(keepends=True)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
            split = node.body[0].lineno - 1
            if split <= node.lineno - 1:      # one-line `def f(): return x`
                continue
            text = textwrap.dedent("".join(lines[node.lineno - 1:node.end_lineno]))
            n_header = split - (node.lineno - 1)
            text_lines = text.splitlines(keepends=True)
            found.append(("".join(text_lines[:n_header]), "".join(text_lines[n_header:])))
    return found


def continuation(header: str, body: str, rng) -> tuple[str, str] | None:
    """The same function with its first 1-3 body lines moved into the prompt (how the model is
    used: complete a function from inside its body); None for one-line bodies."""
    lines = body.splitlines(keepends=True)
    if len(lines) < 2:
        return None
    k = rng.randint(1, min(3, len(lines) - 1))
    return header + "".join(lines[:k]), "".join(lines[k:])


@dataclass
class Examples:
    """Two kinds of rows, mixed: windows of the token stream (pretraining: every token may be
    masked) and function completions (SFT: the header is the prompt, never masked; the body is
    followed by EOS padding to the row end, as LLaDA's SFT pads answers). A completion's prompt is
    the signature, or with probability continuation_fraction the signature and first body lines."""
    stream: torch.Tensor                      # (N,) all training tokens, documents joined by EOS
    functions: list[tuple[list[int], list[int]]]
    seq_len: int
    eos: int
    sft_fraction: float = 0.5
    continuations: list[tuple[list[int], list[int]]] = field(default_factory=list)
    continuation_fraction: float = 0.0

    def batch(self, size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (B, L), prompt_len (B,))."""
        rows, prompts = [], []
        kinds = torch.rand(size, generator=gen) < self.sft_fraction
        for is_sft in kinds.tolist():
            if is_sft and self.functions:
                pool = self.functions
                if self.continuation_fraction and self.continuations \
                        and float(torch.rand(1, generator=gen)) < self.continuation_fraction:
                    pool = self.continuations            # (drawn only when used: older runs replay exactly)
                header, body = pool[int(torch.randint(len(pool), (1,), generator=gen))]
                header = header[: self.seq_len // 2]
                body = body[: self.seq_len - len(header) - 1]
                pad = self.seq_len - len(header) - len(body)
                rows.append(torch.tensor(header + body + [self.eos] * pad))
                prompts.append(len(header))
            else:
                start = int(torch.randint(len(self.stream) - self.seq_len, (1,), generator=gen))
                rows.append(self.stream[start:start + self.seq_len])
                prompts.append(0)
        return torch.stack(rows), torch.tensor(prompts)


def mask_batch(tokens: torch.Tensor, prompt_len: torch.Tensor, mask_id: int, gen: torch.Generator,
               t: torch.Tensor | None = None, eps: float = 1e-3):
    """LLaDA's forward process: per row t ~ U(eps, 1]; each answer token masked with prob t.
    Returns (noisy tokens, masked (B, L) bool, t (B,))."""
    B, L = tokens.shape
    if t is None:
        t = eps + (1 - eps) * torch.rand(B, generator=gen)
    answer = torch.arange(L)[None, :] >= prompt_len[:, None]
    masked = (torch.rand(B, L, generator=gen) < t[:, None]) & answer
    return torch.where(masked, mask_id, tokens), masked, t


def weighted_loss(logits: torch.Tensor, tokens: torch.Tensor, weight: torch.Tensor, prompt_len: torch.Tensor):
    """Cross-entropy on masked positions, each weighted by 1/p for a position masked with
    probability p (0 where not masked), normalised by each row's answer length (LLaDA's loss)."""
    ce = torch.nn.functional.cross_entropy(at_least_fp32(logits).transpose(1, 2), tokens, reduction="none")  # (B, L)
    return ((ce * weight).sum(1) / (tokens.shape[1] - prompt_len).clamp_min(1)).mean()


def at_least_fp32(logits: torch.Tensor) -> torch.Tensor:
    """bf16 logits in fp32 for the loss; fp32 and float64 (the tests' exactness checks) as they are."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def held_out_windows(held_stream: torch.Tensor, seq_len: int, rows: int = 32):
    """(tokens, prompt_len): fixed windows of the held-out modules, every token maskable."""
    starts = torch.linspace(0, len(held_stream) - seq_len - 1, rows).long()
    return torch.stack([held_stream[s:s + seq_len] for s in starts.tolist()]), torch.zeros(rows, dtype=torch.long)


def autocast(device: torch.device | str = "cpu"):
    """bf16 autocast on a GPU, and on a CPU where it has bf16 kernels; fp32 elsewhere (emulated bf16
    trains ~20x slower than fp32 on an AVX2-only CPU: 56 against 1,268 tokens/s for the 8.9M model)."""
    kind = torch.device(device).type
    return torch.autocast(kind, dtype=torch.bfloat16, enabled=kind == "cuda" or cpu.bf16_native())


def device_of(model) -> torch.device:
    return model.embed.weight.device


def forward_loss(model, noisy: torch.Tensor, tokens: torch.Tensor, weight: torch.Tensor, prompt_len: torch.Tensor):
    """weighted_loss of the masked rows, with the vocabulary head run at the weighted (masked)
    positions only (under autocast()): the same loss, without the head's matmul and log-softmax
    at the ~60% of positions whose weight is 0 (the head was a fifth of a training step)."""
    device = device_of(model)
    noisy, tokens, weight, prompt_len = (t.to(device, non_blocking=True) for t in (noisy, tokens, weight, prompt_len))
    where = weight > 0                                                   # (B, L)
    with autocast(device):
        cache = model.new_cache(torch.ones_like(noisy, dtype=torch.bool), keep_kv=False)
        logits = model.head(model.hidden_states(noisy, 0, cache)[where])    # (N, V)
    ce = torch.nn.functional.cross_entropy(at_least_fp32(logits), tokens[where], reduction="none")   # (N,)
    per_position = torch.zeros(weight.shape, dtype=ce.dtype, device=device).masked_scatter(where, ce * weight[where])
    return (per_position.sum(1) / (tokens.shape[1] - prompt_len).clamp_min(1)).mean()


class StdlibSource:
    """tiny-code's rows (Examples) and masks, drawn from one torch.Generator."""

    def __init__(self, cfg, tok, ids: dict[str, int], texts: list[str]):
        import random

        eos = ids["<|endoftext|>"]
        stream = []
        for enc in tok.encode_batch(texts):
            stream.extend(enc.ids + [eos])
        funcs = [f for text in texts for f in functions(text)]
        rng = random.Random(cfg.seed)
        continued = [c for h, b in funcs if (c := continuation(h, b, rng))] if cfg.continuation_fraction else []
        encode = (lambda pairs: [(h.ids, b.ids) for h, b in zip(tok.encode_batch([h for h, _ in pairs]),
                                                                 tok.encode_batch([b for _, b in pairs]))])
        self.examples = Examples(torch.tensor(stream), encode(funcs), cfg.seq_len, eos, cfg.sft_fraction,
                                 encode(continued), cfg.continuation_fraction)
        self.seq_len, self.gen = cfg.seq_len, torch.Generator().manual_seed(cfg.seed)

    def describe(self) -> str:
        return f"{len(self.examples.stream):,} tokens, {len(self.examples.functions):,} functions"

    def batch(self, size: int):
        return self.examples.batch(size, self.gen)

    def loss(self, model, tokens, prompt, mask_id: int):
        noisy, masked, t = mask_batch(tokens, prompt, mask_id, self.gen)
        return forward_loss(model, noisy, tokens, masked / t[:, None], prompt)

    def held_out(self, held_stream: torch.Tensor):
        return held_out_windows(held_stream, self.seq_len)

    def get_state(self):
        return self.gen.get_state()

    def set_state(self, state) -> None:
        self.gen.set_state(state)

    def reseed(self, seed: int) -> None:
        self.gen.manual_seed(seed)
