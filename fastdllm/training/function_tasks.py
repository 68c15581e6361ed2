"""Small Python function tasks in HumanEval's shape, generated: the prompt is a signature and a
docstring (with one example), the answer is the body, and `test` holds a `check(candidate)` with
asserts whose expected values come from running the reference body itself.

Tasks are compositions: over a list of ints, an aggregate (sum, count, product, largest, list) of
a mapped value (the number, its square, double, ...) of the numbers that pass a filter (even,
greater than k, ...); over a string, an operation (count, remove, keep, replace) on a class of
characters (vowels, digits, ...). The held-out split (the `tiny-code` task) uses combinations, a
docstring phrasing and parameter names that training never sees; each of its parts is trained.
A few classic functions (fibonacci, factorial, ...) are training-only, with and without docstring.
"""

from __future__ import annotations

import hashlib
import keyword
import random

from . import story_words
from .story_words import novel_word
from .word_problems import distinct_draws

# name part, docstring phrase, condition (x is the element, {k} a small constant)
FILTERS = {
    "all": ("", "numbers", "True"),
    "even": ("even", "even numbers", "x % 2 == 0"),
    "odd": ("odd", "odd numbers", "x % 2 == 1"),
    "positive": ("positive", "positive numbers", "x > 0"),
    "negative": ("negative", "negative numbers", "x < 0"),
    "above": ("above_{k}", "numbers greater than {k}", "x > {k}"),
    "below": ("below_{k}", "numbers less than {k}", "x < {k}"),
    "multiple": ("multiples_of_{k}", "numbers divisible by {k}", "x % {k} == 0"),
}
# name part, docstring phrase ("the squares of the ..."), expression
MAPS = {
    "same": ("", "", "x"),
    "square": ("squares", "squares of the ", "x * x"),
    "double": ("doubles", "doubles of the ", "2 * x"),
    "plus": ("plus_{k}", "values plus {k} of the ", "x + {k}"),
    "cube": ("cubes", "cubes of the ", "x * x * x"),
    "abs": ("abs", "absolute values of the ", "abs(x)"),
}
AGGREGATES = ("sum", "count", "product", "largest", "list")
CHAR_CLASSES = {
    "vowels": ("vowels", 'c in "aeiou"'),
    "digits": ("digits", "c.isdigit()"),
    "upper": ("uppercase letters", "c.isupper()"),
    "lower": ("lowercase letters", "c.islower()"),
    "spaces": ("spaces", 'c == " "'),
    "letters": ("letters", "c.isalpha()"),
}
STRING_OPS = ("count", "remove", "keep", "star")

# Many training names and verbs, so that a body must copy the signature's name and a docstring's
# verb varies: a model trained on a few names writes one of them whatever the signature says.
LIST_PARAMS = {"train": ["xs", "nums", "numbers", "items", "lst", "arr", "vals", "seq", "ns", "scores", "counts",
                         "ages", "prices", "ints", "entries", "elements", "sizes", "marks", "points", "amounts",
                         "readings", "samples", "weights", "totals", "a", "nums_in", "row", "col", "temps", "steps"],
               "heldout": ["values", "data"]}
STRING_PARAMS = {"train": ["s", "text", "word", "line", "name", "sentence", "msg", "label", "title", "chars",
                           "token", "code", "key", "city", "s1", "query", "note", "tag"],
                 "heldout": ["phrase", "string"]}
VERBS = {"train": ["Return", "Find and return", "Give back", "Work out and return", "Return back"],
         "heldout": ["Compute and return"]}


BODY_NAMES = {"total", "count", "result", "best", "x", "c"}


def parameter(rng: random.Random, split: str, options: dict[str, list[str]]) -> str:
    """The parameter's name; in training often a made-up word (story_words.NOVEL_SHARE says why),
    so that a body can only be right by copying it from the signature. Held-out draws are unchanged."""
    if split == "train" and rng.random() < story_words.NOVEL_SHARE:
        while True:
            name = novel_word(rng)
            if name not in BODY_NAMES and not keyword.iskeyword(name) and name not in options["heldout"]:
                return name
    return rng.choice(options[split])


def _split_of(combo: tuple) -> str:
    """A fixed fifth of the combinations is held out (by a hash, stable across runs and Pythons)."""
    digest = hashlib.sha256(repr(combo).encode()).digest()
    return "heldout" if digest[0] % 5 == 0 else "train"


def _list_task(rng, split) -> dict | None:
    filt, mapping, agg = rng.choice(list(FILTERS)), rng.choice(list(MAPS)), rng.choice(AGGREGATES)
    if agg == "count":
        mapping = "same"
    if _split_of((filt, mapping, agg)) != split:
        return None
    k = rng.randint(2, 9)
    f_name, f_doc, cond = (part.format(k=k) for part in FILTERS[filt])
    m_name, m_doc, expr = (part.format(k=k) for part in MAPS[mapping])
    p = parameter(rng, split, LIST_PARAMS)
    verb = rng.choice(VERBS[split])
    what = f"{m_doc}{f_doc} in {p}"
    doc, name, init, update, result = {
        "sum": (f"{verb} the sum of the {what}.", "sum", "total = 0", f"total += {expr}", "total"),
        "count": (f"{verb} how many {f_doc} there are in {p}.", "count", "count = 0", "count += 1", "count"),
        "product": (f"{verb} the product of the {what} (1 if there are none).", "product", "result = 1",
                    f"result *= {expr}", "result"),
        "largest": (f"{verb} the largest of the {what}, or None if there are none.", "largest", "best = None",
                    None, "best"),
        "list": (f"{verb} a list of the {what}, in order.", "list", "result = []", f"result.append({expr})", "result"),
    }[agg]
    name = "_".join(part for part in (name, m_name, f_name) if part)
    body = [f"    {init}", f"    for x in {p}:"]
    inner = "        "
    if cond != "True":
        body.append(f"        if {cond}:")
        inner += "    "
    if agg == "largest":
        body += [f"{inner}if best is None or {expr} > best:", f"{inner}    best = {expr}"]
    else:
        body.append(f"{inner}{update}")
    body.append(f"    return {result}")
    inputs = [[rng.randint(-9, 20) for _ in range(rng.randint(2, 8))] for _ in range(6)] + [[]]
    return _task(name, p, doc, "\n".join(body) + "\n", inputs, f"list:{filt}:{mapping}:{agg}")


def _string_task(rng, split) -> dict | None:
    klass, op = rng.choice(list(CHAR_CLASSES)), rng.choice(STRING_OPS)
    if _split_of((klass, op)) != split:
        return None
    phrase, cond = CHAR_CLASSES[klass]
    p = parameter(rng, split, STRING_PARAMS)
    verb = rng.choice(VERBS[split])
    doc, name, body = {
        "count": (f"{verb} how many {phrase} there are in {p}.", f"count_{klass}",
                  ["    count = 0", f"    for c in {p}:", f"        if {cond}:", "            count += 1", "    return count"]),
        "remove": (f"{verb} {p} with all its {phrase} removed.", f"remove_{klass}",
                   ['    result = ""', f"    for c in {p}:", f"        if not ({cond}):", "            result += c",
                    "    return result"]),
        "keep": (f"{verb} only the {phrase} of {p}, in order.", f"keep_{klass}",
                 ['    result = ""', f"    for c in {p}:", f"        if {cond}:", "            result += c", "    return result"]),
        "star": (f"{verb} {p} with each of its {phrase} replaced by '*'.", f"star_{klass}",
                 ['    result = ""', f"    for c in {p}:", f"        if {cond}:", '            result += "*"',
                  "        else:", "            result += c", "    return result"]),
    }[op]
    alphabet = "abcdefghijklmnopqrstuvwxyzaeiouAEIOBCDXYZ0123456789   "
    inputs = ["".join(rng.choice(alphabet) for _ in range(rng.randint(3, 12))) for _ in range(6)] + [""]
    return _task(name, p, doc, "\n".join(body) + "\n", inputs, f"string:{klass}:{op}")


# Training-only classics: the quick start's `def fibonacci(n):` is one of them.
CLASSICS = [
    ("fibonacci", "n", "Return the n-th Fibonacci number (fibonacci(0) is 0, fibonacci(1) is 1).",
     "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n", [0, 1, 2, 7, 10, 15]),
    ("factorial", "n", "Return n factorial.",
     "    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result\n", [0, 1, 4, 6, 9]),
    ("is_prime", "n", "Return True if n is a prime number.",
     "    if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n        if n % d == 0:\n"
     "            return False\n    return True\n", [0, 1, 2, 9, 13, 25, 97]),
    ("gcd", "a, b", "Return the greatest common divisor of a and b.",
     "    while b:\n        a, b = b, a % b\n    return a\n", [(12, 18), (7, 5), (0, 4), (100, 75)]),
    ("reverse_string", "s", "Return s reversed.", "    return s[::-1]\n", ["abc", "", "hello world"]),
    ("is_palindrome", "s", "Return True if s reads the same forwards and backwards.",
     "    return s == s[::-1]\n", ["racecar", "ab", "", "abba"]),
    ("add", "a, b", "Return the sum of a and b.", "    return a + b\n", [(1, 2), (-3, 3), (10, 32)]),
    ("is_even", "n", "Return True if n is even.", "    return n % 2 == 0\n", [0, 3, 10, -4]),
    ("sum_to", "n", "Return the sum of the integers from 1 to n.",
     "    total = 0\n    for i in range(1, n + 1):\n        total += i\n    return total\n", [0, 1, 10, 100]),
    ("count_words", "s", "Return the number of words in s.", "    return len(s.split())\n", ["a b c", "", " hi  there "]),
    ("maximum", "xs", "Return the largest number in xs.",
     "    best = xs[0]\n    for x in xs[1:]:\n        if x > best:\n            best = x\n    return best\n",
     [[3, 1, 2], [-5], [4, 9, 9, 0]]),
]


def _classic(rng) -> dict:
    name, params, doc, body, inputs = rng.choice(CLASSICS)
    task = _task(name, params, doc, body, inputs, f"classic:{name}")
    if rng.random() < 0.5:                           # the bare signature, as a user types it: with or
        task["prompt"] = f"def {name}({params}):\n"   # without the line break (then the answer starts with it)
        if rng.random() < 0.5:
            task["prompt"], task["canonical_solution"] = task["prompt"][:-1], "\n" + body
    return task


def _task(name: str, params: str, doc: str, body: str, inputs: list, kind: str) -> dict:
    """The HumanEval-shaped record; expected values by running the reference body."""
    source = f"def {name}({params}):\n" + body
    scope: dict = {}
    exec(source, scope)                              # our own generated code, never user input
    fn = scope[name]
    call = (lambda v: fn(*v)) if "," in params else fn
    shown = (lambda v: ", ".join(map(repr, v))) if "," in params else repr
    inputs = list({repr(v): v for v in inputs}.values())            # distinct, in order
    shows = [v for v in inputs if call(v) not in (None, [], "", 0, v)]   # an example that shows something
    example = (shows or inputs)[0]
    prompt = (f'def {name}({params}):\n    """{doc}\n\n    >>> {name}({shown(example)})\n'
              f'    {call(example)!r}\n    """\n')
    asserts = "\n".join(f"    assert candidate({shown(v)}) == {call(v)!r}" for v in inputs)
    return {"task_id": name, "prompt": prompt, "canonical_solution": body, "entry_point": name,
            "test": f"def check(candidate):\n{asserts}\n", "kind": kind}


def generate(rng: random.Random, split: str = "train", classics: float = 0.1) -> dict:
    """One task of `split`; in training, a share `classics` of the tasks are the classic functions."""
    if split == "train" and rng.random() < classics:
        return _classic(rng)
    while True:
        task = (_list_task if rng.random() < 0.65 else _string_task)(rng, split)
        if task is not None:
            return task


def held_out_set(n: int, seed: int = 2026) -> list[dict]:
    """The `tiny-code` test set: n held-out tasks with distinct prompts, the same for a given seed."""
    tasks = distinct_draws(lambda rng: generate(rng, "heldout"), "prompt", n, seed)
    for i, task in enumerate(tasks):
        task["task_id"] = f"tiny-code/{i}"
    return tasks
