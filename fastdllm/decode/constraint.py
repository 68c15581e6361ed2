"""Structured output in the mask loop (docs/specs/structured-output.md): a left-to-right grammar matcher
(llguidance) per constrained row, met at the row's frontier, its leftmost masked position.

- `Spec`: what was asked (JSON, a JSON Schema, a regex, a Lark grammar), as text; torch-free.
- `Compiled`: a Spec checked against a tokenizer (a bad one is a one-line UserError); makes matchers.
- `RowConstraints`: a batch's matchers, one per constrained row (None: a free row). The step calls
  `restrict` on the logits (the frontier's disallowed tokens to -inf) and `decide` on the rule's
  choice (only the run from the frontier whose tokens the matcher accepts is committed).

llguidance is imported when a constraint is compiled, never at import time (the `structured` extra).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError, UserError

KINDS = ("json", "json_schema", "regex", "grammar")
# one form of JSON (as json.dumps writes it): no free whitespace for a model to loop in
JSON_FORM = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_TOKENIZERS: dict[int, tuple[Any, Any]] = {}     # id(hf tokenizer) -> (it, its llguidance tokenizer)
MAX_DEPTH = 100             # a schema's nesting (objects and arrays) that is taken (the library's ends near 128)
PROBE_TOKENS = 64           # forced tokens consumed when compiling: a matcher that fails on them is refused


class ConstraintError(UsageError):
    """A schema, regex or grammar the library refuses (exit 2 in the CLI, HTTP 400 in serve)."""


@dataclass(frozen=True)
class Spec:
    kind: str                   # one of KINDS
    source: str = ""            # the schema as JSON text, the regex, or the Lark grammar ("" for json)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(f"constraint kind {self.kind!r} is not one of {', '.join(KINDS)}")

    @property
    def label(self) -> str:
        return {"json": "JSON object", "json_schema": "JSON Schema", "regex": "regex", "grammar": "grammar"}[self.kind]

    def grammar(self) -> str:
        """llguidance's grammar text for this spec (UserError: one line, when the text is not JSON)."""
        llguidance = require()
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.source)
        if self.kind == "grammar":
            return llguidance.LLMatcher.grammar_from_lark(self.source)
        schema: Any = {"type": "object"}
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.source) if isinstance(self.source, str) else self.source
            except json.JSONDecodeError as e:
                raise ConstraintError(f"JSON Schema: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
            except (RecursionError, ValueError) as e:        # nested too deep; an integer of 4300+ digits
                raise ConstraintError(f"JSON Schema: not read ({one_line(str(e) or type(e).__name__)})") from None
            if not isinstance(schema, (dict, bool)):
                raise ConstraintError(f"JSON Schema: expected an object, got {type(schema).__name__}")
            held_exactly(schema)
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_FORM)
        except (ValueError, TypeError) as e:                  # a value the library cannot convert
            raise ConstraintError(f"JSON Schema: {one_line(str(e))}") from None


def held_exactly(schema: Any, label: str = "JSON Schema") -> None:
    """ConstraintError (one line, naming the place) for a schema the matcher would not hold as
    written: it reads numbers as doubles and integer ranges as 64-bit integers, so an integer a
    double rounds (9007199254740993 -> ...992: a bound or constant silently moved), a number
    outside the 64-bit range, a non-finite one (1e400 arrives as inf) and nesting deeper than
    MAX_DEPTH are refused. Walks without recursion (a request may nest thousands deep)."""
    stack = [(schema, "", 0)]                                           # (value, its path, depth)
    while stack:
        value, path, depth = stack.pop()
        at = f" at {path}" if path else ""
        if isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                raise ConstraintError(f"{label}: nested more than {MAX_DEPTH} levels deep{at}")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend(reversed([(v, f"{path}.{k}" if path else str(k), depth + 1) for k, v in items]))
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        elif not math.isfinite(value):
            raise ConstraintError(f"{label}: {value}{at} is not a finite number")
        elif not -2 ** 63 <= value < 2 ** 63 or (isinstance(value, int) and float(value) != value):
            digits = str(abs(value))
            shown = str(value) if len(digits) <= 24 else f"{str(value)[:20]}... ({len(digits)} digits)"
            raise ConstraintError(f"{label}: {shown}{at} is not held exactly by the matcher, which reads numbers "
                                  f"as doubles and 64-bit integers (beyond 2^53 only integers a double holds exactly)")


def require():
    try:
        import llguidance
        import llguidance.hf  # noqa: F401
    except ImportError:
        raise UserError("structured output needs llguidance: pip install 'fastdllm[structured]'") from None
    return llguidance


def ll_tokenizer(tokenizer):
    """The llguidance tokenizer of a Hugging Face fast tokenizer, built once per tokenizer (seconds
    for a 150k vocabulary)."""
    llguidance = require()
    found = _TOKENIZERS.get(id(tokenizer))
    if found is None or found[0] is not tokenizer:
        found = _TOKENIZERS[id(tokenizer)] = (tokenizer, llguidance.hf.from_tokenizer(tokenizer))
    return found[1]


class Compiled:
    """A Spec checked against a tokenizer. Raises UserError (one line) for a schema, regex or
    grammar the library refuses, and for one that matches nothing."""

    def __init__(self, spec: Spec, tokenizer):
        llguidance = require()
        self.spec, self.tokenizer = spec, ll_tokenizer(tokenizer)
        self.grammar = spec.grammar()
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(self.grammar, self.tokenizer)
        if failed:
            raise ConstraintError(f"{spec.label}: {one_line(messages[0])}")
        first = self.matcher()
        if first.is_error():
            raise ConstraintError(f"{spec.label}: {one_line(first.get_error())}")
        if not first.is_accepting() and (first.is_stopped() or not self.can_start(first)):
            raise ConstraintError(f"{spec.label}: it matches nothing (no token can start an answer)")
        forced = first.compute_ff_tokens()[:PROBE_TOKENS]    # what every answer starts with: a matcher
        if forced and not first.consume_tokens(forced) or first.is_error():  # that fails on it fails later too
            raise ConstraintError(f"{spec.label}: the matcher fails on the answer's first tokens "
                                  f"({first_line(first.get_error())})")

    def can_start(self, matcher) -> bool:
        """Whether some token other than the library's end token may come first."""
        allowed = bits(matcher.compute_bitmask(), self.tokenizer.vocab_size)
        allowed[self.tokenizer.eos_token] = False
        return bool(allowed.any())

    def matcher(self):
        import llguidance

        return llguidance.LLMatcher(self.tokenizer, self.grammar, log_level=0)

    def accepts(self, ids: list[int]) -> bool:
        """Whether `ids` (an answer, without its end token) is a whole sentence of the constraint."""
        m = self.matcher()
        return m.consume_tokens(ids) and m.is_accepting() if ids else m.is_accepting()


def first_line(message: str) -> str:
    """A matcher's error without the state it dumps after it ('<state>', tokens, parser JSON)."""
    return next((line.strip() for line in message.splitlines() if line.strip()), "the matcher failed")


def one_line(message: str) -> str:
    """The library's message as one line: its lines that say something (not the grammar's echo
    and its '^' pointers), joined, without the grammar position ('at 1(8): ')."""
    lines = [line.strip() for line in message.strip().splitlines()]
    said = [line for line in lines if line and not set(line) <= set("^ ") and not re.match(r"\d+ \|", line)]
    text = " ".join(said) or "refused"
    return re.sub(r"^at \d+\(\d+\): ", "", text)


class RowConstraints:
    """The matchers of one batch's rows (None: a free row, decided as without constraints)."""

    def __init__(self, compiled: list[Compiled | None], stops: tuple[int, ...]):
        self.compiled, self.stops = compiled, tuple(stops)
        self.matchers = [c.matcher() if c is not None else None for c in compiled]
        self.ended = [False] * len(compiled)      # an end token is committed: the rest is filler
        self.errors: list[str | None] = [None] * len(compiled)   # the matcher failed: why (the row ended there)
        self.seconds, self.calls = 0.0, 0         # matcher time (mask + validate), for the bench

    def restrict(self, logits, candidate) -> Any:
        """logits (B, K, V), in place: at each constrained row's frontier (its first candidate
        column; columns are in position order) every token the matcher does not allow gets -inf; the end tokens only where the
        answer is complete. candidate (B, K) host bool. Returns logits."""
        began = time.perf_counter()
        V = logits.shape[-1]
        for b, m in enumerate(self.matchers):
            cols = candidate[b].nonzero()
            if m is None or self.ended[b] or not len(cols):
                continue
            frontier = int(cols[0, 0])                                      # the leftmost candidate
            allowed = bits(m.compute_bitmask(), V)                          # (V,) bool
            allowed[list(self.stops)] = m.is_accepting()
            if m.is_error() or not bool(allowed.any()):                     # a dead end: nothing can follow
                self.fail(b, m)                                             # (decide ends the row there)
                allowed[:] = False
                allowed[list(self.stops)] = True
            logits[b, frontier].masked_fill_(~allowed.to(logits.device), float("-inf"))
            self.calls += 1
        self.seconds += time.perf_counter() - began
        return logits

    def decide(self, tokens, chosen, candidate):
        """tokens, chosen, candidate (B, K) host tensors, columns in position order (the block's
        masked positions first). For each constrained row: the frontier, then each next candidate
        while the rule chose it and its token is valid after its predecessors; an end token the
        matcher may take there ends the row (the rest of its candidates take it, as filler); after
        the run, the tokens the grammar forces (llguidance's fast-forward: a schema's keys and
        punctuation) take the next candidates, without asking the model. Returns (tokens, chosen), new tensors; free rows are as given."""
        import torch

        began = time.perf_counter()
        tokens, chosen = tokens.clone(), chosen.clone()
        for b, m in enumerate(self.matchers):
            cols = candidate[b].nonzero()[:, 0].tolist()
            if m is None or not cols:
                continue
            if self.ended[b]:
                tokens[b, cols], chosen[b, cols] = self.stops[0], True
                continue
            seq, picked = tokens[b, cols].tolist(), chosen[b, cols].tolist()
            run = 1                                                         # the frontier, always
            while run < len(seq) and picked[run]:
                run += 1
            known = self.compiled[b].tokenizer.vocab_size                  # ids past it (the head's padding) put
            run = next((i for i, t in enumerate(seq[:run]) if t >= known and t not in self.stops), run)  # it in error
            stop = next((i for i, t in enumerate(seq[:run]) if t in self.stops), None)
            body = seq[:run if stop is None else stop]
            n = m.validate_tokens(body) if body and not m.is_error() else 0
            if n and not m.consume_tokens(body[:n]):                        # valid, yet the matcher failed
                n = 0
            chosen[b, cols] = False
            chosen[b, cols[:n]] = True
            if stop is not None and n == stop and m.is_accepting():         # the end, where it may come
                self.ended[b] = True
                tokens[b, cols[n:]], chosen[b, cols[n:]] = seq[stop], True
            elif n == 0:                                                    # a dead end (see restrict)
                self.fail(b, m)
                tokens[b, cols], chosen[b, cols] = self.stops[0], True
            else:                                                           # jump forward: what the grammar forces
                forced = m.compute_ff_tokens()[:len(cols) - n]
                if forced and m.consume_tokens(forced):
                    at = cols[n:n + len(forced)]
                    tokens[b, at], chosen[b, at] = torch.tensor(forced), True
                elif m.is_error():                                          # its next step ends the row
                    self.fail(b, m)
        self.seconds += time.perf_counter() - began
        return tokens, chosen

    def fail(self, b: int, m) -> None:
        """Row b's matcher failed (an error of the library, or no token can follow an answer that is
        not complete): the row ends here, its answer reported as failed, never as cut by its length."""
        if self.errors[b] is None:
            self.errors[b] = first_line(m.get_error()) if m.is_error() else "no token of the vocabulary can " \
                "continue the answer"
        self.ended[b] = True

    def complete(self, answers: list[list[int]]) -> list[bool | None]:
        """Per row: whether its answer (as reported, cut at its length) is a whole sentence of its
        constraint (never where its matcher failed); None for a free row."""
        return [None if c is None else e is None and c.accepts(ids)
                for c, ids, e in zip(self.compiled, answers, self.errors)]


def bits(mask: bytes, V: int):
    """llguidance's bitmask (one bit per token, little-endian within bytes) -> (V,) bool, cut or
    padded with False to the model's vocabulary V."""
    import torch

    raw = torch.frombuffer(bytearray(mask), dtype=torch.uint8)
    flags = ((raw[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1).bool().flatten()
    out = torch.zeros(V, dtype=torch.bool)
    n = min(V, flags.numel())
    out[:n] = flags[:n]
    return out
