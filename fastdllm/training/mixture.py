"""The built-in tiny-llada model's training rows: generated word problems and function tasks (raw
and in the chat template), classic functions, and real Python source (stdlib windows for plain
continuation, stdlib functions signature -> body). Drawn fresh at every step from a seeded
`random.Random` (its state is part of the resumable training state), so no row is seen twice.

A row is prompt + answer + end-of-text padding to the row length, as LLaDA's SFT pads answers:
the answer ends where the task needs, which is what lets decoding stop early. Chat answers end
with <|eot_id|> first, as the chat template's turns do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from . import data, function_tasks, tokenizer, word_problems

# Share of each kind of row (sums to 1). "arith": rows of arithmetic facts (word_problems.drill_line)
# with no prompt; "stdlib_window": the stdlib's source with no prompt; "echo": a training prompt, then
# the same text again, the plainest lookup; "repeat": random tokens, then the same tokens again, with
# no prompt (either copy may be masked): nothing but the other copy predicts a token, the signal
# that makes a model learn to look a token up (docs/builtin-model-training.md, seventh session).
# A repeat row draws its tokens from one of REPEAT_ALPHABETS (share, size): the ten digits, the first
# 32 ordinary ids (punctuation, digits, capitals), or the whole vocabulary: a small model learns to
# copy from a small alphabet within ~1,000 steps and from 4,096 tokens not in 2,500
# (scripts/copy_task.py --copy-vocab, eighth session), and digits are what word problems copy.
# (The third session's "recall" rows, a problem -> its names and numbers, did not move the copy probe
# and gave way to made-up names: story_words.NOVEL_SHARE.)
WEIGHTS = {"gsm_raw": 0.22, "gsm_chat": 0.12, "arith": 0.08, "code_raw": 0.22, "code_chat": 0.08,
           "stdlib_window": 0.04, "stdlib_function": 0.04, "echo": 0.12, "repeat": 0.08}
REPEAT_ALPHABETS = "10:0.6,32:0.2,0:0.2"   # size:share; 10: the digits, 0: the whole vocabulary (a curriculum stage widens it)
UNPROMPTED = ("stdlib_window", "arith", "repeat")      # rows of any length, every token may be masked
TIGHT_LIMIT = 192        # a tight batch's longest row before its padding
TIGHT_GROUP = 8          # batches drawn at once and sorted into groups of like lengths
PROMPTED = ("gsm_raw", "gsm_chat", "code_raw", "code_chat", "stdlib_function", "echo")   # rows of prompt + answer


def gsm_prompt(question: str) -> str:
    """The raw prompt of a word problem (the `tiny-gsm` task's, lm-eval gsm8k's zero-shot form)."""
    return f"Question: {question}\nAnswer:"


def chat_prompt(user: str) -> str:
    """LLaDA's chat template for one user turn (tokenizer.LLADA_CHAT_TEMPLATE rendered)."""
    return (f"{tokenizer.BOS}{tokenizer.HEADER_START}user{tokenizer.HEADER_END}\n\n{user.strip()}{tokenizer.EOT}"
            f"{tokenizer.HEADER_START}assistant{tokenizer.HEADER_END}\n\n")


def texts(rng: random.Random, kind: str, stdlib_functions: list[tuple[str, str]]) -> tuple[str, str]:
    """(prompt, answer) of one row of `kind` (training split only); the answer's stop is added by
    the caller. stdlib_window rows are drawn from the token stream instead."""
    if kind == "gsm_raw":
        p = word_problems.generate(rng, "train")
        return gsm_prompt(p["question"]), " " + p["answer"]
    if kind == "gsm_chat":
        p = word_problems.generate(rng, "train")
        return chat_prompt(p["question"]), p["answer"]
    if kind == "code_raw":
        t = function_tasks.generate(rng, "train")
        return t["prompt"], t["canonical_solution"]
    if kind == "code_chat":
        t = function_tasks.generate(rng, "train")
        return chat_prompt(t["prompt"]), t["prompt"] + t["canonical_solution"]
    if kind == "stdlib_function":
        return rng.choice(stdlib_functions)
    if kind == "echo":
        text = (word_problems.generate(rng, "train")["question"] if rng.random() < 0.6
                else function_tasks.generate(rng, "train")["prompt"])
        return f"{text}\nSay it again:\n", text
    raise ValueError(kind)


@dataclass
class Mixture:
    """Batches of rows of one length per batch (most short, some long so that long canvases are seen)."""
    tok: object                                     # tokenizers.Tokenizer
    stream: torch.Tensor                            # stdlib training source, documents joined by EOS
    stdlib_functions: list[tuple[str, str]]
    ids: dict[str, int]
    row_lengths: tuple[tuple[int, float], ...] = ((0, 0.85), (256, 0.10), (512, 0.05))
    weights: dict[str, float] = field(default_factory=lambda: dict(WEIGHTS))
    repeat_alphabets: tuple[tuple[int, float], ...] = field(default_factory=lambda: shares(REPEAT_ALPHABETS))   # (size, share)
    pending: list = field(default_factory=list)     # tight batches drawn and not yet used (resume state)

    def batch(self, size: int, rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (B, L), prompt_len (B,)); prompt_len 0 for stdlib windows (every token may be masked).
        A row length of 0 draws a tight batch: TIGHT_GROUP batches' rows (of up to TIGHT_LIMIT tokens)
        are drawn at once and sorted by length, and each batch, one group of like lengths, is padded to
        its longest row plus 1-16 end-of-text tokens (fixed-length batches were half padding)."""
        L = rng.choices([n for n, _ in self.row_lengths], [w for _, w in self.row_lengths])[0]
        if L:
            kinds = rng.choices(list(self.weights), list(self.weights.values()), k=size)
            drawn = [(kind, self.prompted(kind, rng, L)) for kind in kinds]
        else:
            if not self.pending:
                self.pending = self.tight_groups(size, rng)
            drawn = self.pending.pop()
            L = max(len(p) + len(a) for _, (p, a) in drawn) + rng.randint(1, 16)
        rows, prompts = [], []
        for kind, (p, a) in drawn:
            if kind == "stdlib_window":
                start = rng.randrange(len(self.stream) - L)
                rows.append(self.stream[start:start + L])
            elif kind == "arith":
                rows.append(self.drill_row(rng, L))
            elif kind == "repeat":
                rows.append(self.repeat_row(rng, L))
            else:
                rows.append(torch.tensor(p + a + [self.ids[tokenizer.EOS]] * (L - len(p) - len(a))))
            prompts.append(len(p))
        return torch.stack(rows), torch.tensor(prompts)

    def tight_groups(self, size: int, rng: random.Random) -> list:
        """TIGHT_GROUP batches of (kind, (prompt ids, answer ids)), each of rows of like lengths; rows
        with no prompt (stdlib windows, drills: any length) get a random length to sort by."""
        kinds = rng.choices(list(self.weights), list(self.weights.values()), k=size * TIGHT_GROUP)
        drawn = [(kind, self.prompted(kind, rng, TIGHT_LIMIT)) for kind in kinds]
        length = {id(d): len(d[1][0]) + len(d[1][1]) or rng.randrange(48, TIGHT_LIMIT) for d in drawn}
        drawn.sort(key=lambda d: length[id(d)])
        groups = [drawn[i:i + size] for i in range(0, len(drawn), size)]
        rng.shuffle(groups)
        return groups

    def prompted(self, kind: str, rng: random.Random, L: int) -> tuple[list[int], list[int]]:
        """(prompt ids, answer ids) of one row of `kind` that fits L tokens with one padding token;
        ([], []) for the kinds with no prompt (stdlib windows, drills), filled once L is known."""
        if kind in UNPROMPTED:
            return [], []
        for attempt in range(100):          # short rows take the shorter draws; longer rows all of them
            prompt, answer = texts(rng, kind, self.stdlib_functions)
            p, a = self.encode(prompt), self.encode(answer)
            a += [self.ids[tokenizer.EOT]] if kind.endswith("_chat") else []
            if len(p) + len(a) < L and len(p) <= L // 2:
                break
            if attempt > 20:
                kind = "gsm_raw"
        return p, a

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def drill_row(self, rng: random.Random, L: int) -> torch.Tensor:
        """L tokens of arithmetic facts, one per line (the last one cut at the row end)."""
        ids: list[int] = []
        while len(ids) < L:
            ids += self.encode(word_problems.drill_line(rng) + "\n")
        return torch.tensor(ids[:L])

    def repeat_row(self, rng: random.Random, L: int) -> torch.Tensor:
        """n random tokens of one of the repeat alphabets (8 <= n <= 64, both copies within L), a
        newline, the same n tokens, then end-of-text padding to L."""
        size = rng.choices([n for n, _ in self.repeat_alphabets], [w for _, w in self.repeat_alphabets])[0]
        alphabet = repeat_alphabet(self.tok, set(self.ids.values()), size)
        n = rng.randint(8, max(8, min(64, (L - 2) // 2)))
        seq = [rng.choice(alphabet) for _ in range(n)]
        row = seq + self.encode("\n") + seq
        return torch.tensor((row + [self.ids[tokenizer.EOS]] * L)[:L])


def repeat_alphabet(tok, specials: set[int], size: int) -> list[int]:
    """The ids a repeat row draws from: size 10 the digit tokens (where each digit is one token), else
    the first `size` ordinary ids (0: all of them)."""
    ordinary = [i for i in range(tok.get_vocab_size()) if i not in specials]
    digits = [tok.token_to_id(str(d)) for d in range(10)]
    if size == 10 and None not in digits:
        return digits
    return ordinary[:size] if size else ordinary


def block_mask_batch(tokens: torch.Tensor, prompt_len: torch.Tensor, mask_id: int, rng: random.Random,
                     block_share: float, block: int = 32, eps: float = 1e-3):
    """Masks for one batch, returning (noisy, masked (B, L), weight (B, L)) where weight is 1/p for a
    position masked with probability p. A row is masked either as LLaDA trains (t ~ U(eps, 1], each
    answer token with probability t) or, with probability `block_share` for rows with a prompt, in
    the state block-wise decoding meets: the answer's blocks before block j clean, block j masked
    with probability t, everything after it masked."""
    B, L = tokens.shape
    pos = torch.arange(L)
    prob = torch.zeros(B, L)
    for r in range(B):
        start, t = int(prompt_len[r]), eps + (1 - eps) * rng.random()
        if start and rng.random() < block_share:
            j = rng.randrange(max(1, (L - start) // block))
            lo = start + j * block
            prob[r] = torch.where(pos < lo, 0.0, torch.where(pos < lo + block, t, 1.0))
        else:
            prob[r] = torch.where(pos >= start, t, 0.0)
    gen = torch.Generator().manual_seed(rng.getrandbits(62))
    masked = (torch.rand(B, L, generator=gen) < prob) & (prob > 0)
    weight = torch.where(masked, 1.0 / prob.clamp_min(eps), 0.0)
    return torch.where(masked, mask_id, tokens), masked, weight


def tokenizer_texts(rng: random.Random, stdlib_texts: list[str], n_generated: int = 20000):
    """What the BPE is trained on: the stdlib training files and generated training rows."""
    yield from stdlib_texts
    for _ in range(n_generated):
        p = word_problems.generate(rng, "train")
        t = function_tasks.generate(rng, "train")
        yield p["question"] + "\n" + p["answer"] + "\n\n" + t["prompt"] + t["canonical_solution"]


def held_out_rows(tok, ids: dict[str, int], L: int = 192, n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed held-out rows for the training log's loss: tiny-gsm and tiny-code test items."""
    rows, prompts = [], []
    items = [(gsm_prompt(p["question"]), " " + p["answer"]) for p in word_problems.held_out_set(n // 2)]
    items += [(t["prompt"], t["canonical_solution"]) for t in function_tasks.held_out_set(n - n // 2)]
    for prompt, answer in items:
        p, a = tok.encode(prompt).ids, tok.encode(answer).ids
        p, a = p[: L // 2], a[: L - min(len(p), L // 2) - 1]
        rows.append(torch.tensor(p + a + [ids[tokenizer.EOS]] * (L - len(p) - len(a))))
        prompts.append(len(p))
    return torch.stack(rows), torch.tensor(prompts)



def weights_of(spec: str) -> dict[str, float]:
    """"repeat:0.5,gsm_raw:0.5" -> {kind: share}; "mixture" -> the recipe's WEIGHTS. Unknown kinds are refused."""
    if spec == "mixture":
        return dict(WEIGHTS)
    weights = {k.strip(): float(v) for k, v in (part.split(":") for part in spec.split(","))}
    if unknown := set(weights) - set(WEIGHTS):
        raise ValueError(f"mixture_weights: unknown kinds {sorted(unknown)} (known: {', '.join(WEIGHTS)})")
    return weights


def shares(spec: str) -> tuple[tuple[int, float], ...]:
    """"0:0.85,256:0.1,512:0.05" -> ((0, 0.85), (256, 0.1), (512, 0.05)): a size (row length, 0: tight;
    repeat alphabet, 0: the whole vocabulary) and its share."""
    return tuple((int(n), float(w)) for n, w in (part.split(":") for part in spec.split(",")))


class MixtureSource:
    """tiny-llada's rows and masks, drawn from one random.Random (train.py's data source)."""

    def __init__(self, cfg, tok, ids: dict[str, int], texts: list[str]):
        stream = []
        for enc in tok.encode_batch(texts):
            stream.extend(enc.ids + [ids[tokenizer.EOS]])
        functions = [f for text in texts for f in data.functions(text)]
        self.mixture = Mixture(tok, torch.tensor(stream), functions, ids, shares(cfg.row_lengths),
                               weights_of(cfg.mixture_weights), shares(cfg.repeat_alphabets))
        self.cfg, self.tok, self.ids, self.rng = cfg, tok, ids, random.Random(cfg.seed)

    def describe(self) -> str:
        return (f"generated rows {self.mixture.weights}, {len(self.mixture.stream):,} stdlib tokens, "
                f"{len(self.mixture.stdlib_functions):,} stdlib functions")

    def batch(self, size: int):
        return self.mixture.batch(size, self.rng)

    def loss(self, model, tokens, prompt, mask_id: int):
        noisy, masked, weight = block_mask_batch(tokens, prompt, mask_id, self.rng, self.cfg.block_share)
        if self.cfg.loss_weight == "flat":              # every masked token weighs 1 (train.py says why)
            weight = masked.float()
        return data.forward_loss(model, noisy, tokens, weight, prompt)

    def held_out(self, held_stream: torch.Tensor):
        return held_out_rows(self.tok, self.ids, self.cfg.seq_len)

    def get_state(self):
        return {"rng": self.rng.getstate(), "pending": self.mixture.pending}

    def set_state(self, state) -> None:
        """A state of get_state, or a bare random state (runs before tight batches)."""
        if isinstance(state, dict):
            self.rng.setstate(state["rng"])
            self.mixture.pending = state["pending"]
        else:
            self.rng.setstate(state)

    def reseed(self, seed: int) -> None:
        self.rng.seed(seed)
        self.mixture.pending = []
