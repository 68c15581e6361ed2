"""Grade-school word problems with worked steps and GSM8K's answer format (`#### 42`), generated.

Two splits that share the arithmetic but not the words: the held-out split (the `tiny-gsm` task)
uses story kinds, sentence phrasings, people and objects that the training split never uses, and
every held-out question holds a number from HELD_BAND, which no training question contains. What
the model must carry over is the arithmetic and the reading: which numbers a sentence combines.

A problem is a dict: question, answer (worked steps, then `#### N`), target (N as a string), kind.
Its people, things and numbers come from story_words.py (the split's lists, made-up words, HELD_BAND).
"""

from __future__ import annotations

import random
from typing import Callable

from .story_words import CONTAINERS, HELD_BAND, ITEMS, NAMES, Numbers, Redraw, pick, two_names

# --- one person, one kind of object, a chain of events --------------------------------------------
# Each event: its sentences (train / held-out phrasings), and the worked step for it.

EVENTS = {
    "gain": {"train": ["{P} buys {n} more {X}.", "{P} finds {n} more {X}.", "{P} gets {n} more {X} from a friend.",
                       "{P} is given {n} {X}.", "Then {P} collects {n} more {X}.", "A neighbor gives {P} {n} {X}."],
             "heldout": ["Later, {n} extra {X} are added to {P}'s collection."]},
    "lose": {"train": ["{P} gives {n} {X} to a friend.", "{P} loses {n} {X}.", "{P} uses {n} of the {X}.",
                       "{P} drops {n} {X}.", "Then {P} sells {n} {X}.", "{n} of {P}'s {X} get lost."],
             "heldout": ["Afterwards, {n} of the {X} break and are thrown away."]},
    "gain_groups": {"train": ["{P} buys {k} {C} with {m} {X} in each.", "{P} gets {k} {C} of {X}, each with {m} {X}.",
                             "Then {P} opens {k} new {C} that hold {m} {X} each."],
                    "heldout": ["Next, {k} {C} arrive for {P}, and each one contains {m} {X}."]},
    "lose_groups": {"train": ["{P} gives {m} {X} to each of {k} friends.", "{P} gives {k} friends {m} {X} each.",
                             "{P} shares out {m} {X} to every one of {k} neighbors."],
                    "heldout": ["{P} hands out {m} {X} apiece to {k} classmates."]},
    "times": {"train": ["{P} ends up with {k} times as many {X} as before.", "The number of {X} {P} has grows {k} times.",
                       "Then {P} has {k} times the {X} from before."],
              "heldout": ["By the end of the week, {P}'s pile of {X} is {k} times as big."]},
    "half": {"train": ["{P} gives away half of the {X}.", "{P} sells half of the {X}.", "{P} loses half of the {X}."],
             "heldout": ["Exactly half of the {X} go to {P}'s cousin."]},
}
QUESTIONS = {"train": ["How many {X} does {P} have now?", "How many {X} does {P} have at the end?",
                       "How many {X} are left for {P}?", "How many {X} does {P} end with?"],
             "heldout": ["What is the number of {X} that {P} is left with?"]}
SHARE = {"train": ["{P} puts all the {X} into {k} equal groups. How many {X} are in each group?",
                   "{P} shares the {X} equally among {k} friends. How many {X} does each friend get?"],
         "heldout": ["If {P} splits the {X} evenly into {k} piles, how many {X} go in each pile?"]}
# Event pairs (one right after the other) that only held-out chains use.
HELD_PAIRS = {("gain_groups", "half"), ("times", "lose_groups"), ("half", "gain")}


def _event_step(kind: str, a: int, num: Numbers, rng) -> tuple[dict, list[str], int] | None:
    """(sentence fields, worked lines, new total) for one event on a total of `a`, or None."""
    if kind == "gain":
        n = num(2, 99)
        return {"n": n}, ["{P} has {a} + {n} = {b} {X}."], a + n
    if kind == "lose":
        if a < 3:
            return None
        n = num(1, min(a - 1, 99))
        return {"n": n}, ["{P} has {a} - {n} = {b} {X} left."], a - n
    if kind == "gain_groups":
        k, m = num(2, 9), num(2, 12)
        return {"k": k, "m": m, "p": k * m}, ["{P} gets {k} * {m} = {p} {X}.", "{P} has {a} + {p} = {b} {X}."], a + k * m
    if kind == "lose_groups":
        k, m = num(2, 9), num(2, 12)
        if k * m >= a:
            return None
        return {"k": k, "m": m, "p": k * m}, ["{P} gives away {k} * {m} = {p} {X}.",
                                             "{P} has {a} - {p} = {b} {X} left."], a - k * m
    if kind == "times":
        k = num(2, 4)
        if a * k > 999:
            return None
        return {"k": k}, ["{P} has {a} * {k} = {b} {X}."], a * k
    if kind == "half":
        if a % 2:
            return None
        return {"h": a // 2}, ["Half of {a} is {a} / 2 = {h}.", "{P} has {a} - {h} = {b} {X} left."], a - a // 2
    raise ValueError(kind)


def chain(rng: random.Random, split: str) -> dict | None:
    num = Numbers(rng, split)
    P, X, C = pick(rng, split, NAMES), pick(rng, split, ITEMS), pick(rng, split, CONTAINERS)
    start = num.main(5, 99)
    total, sentences, lines, kinds = start, [f"{P} has {start} {X}."], [], []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(list(EVENTS))
        step = _event_step(kind, total, num, rng)
        if step is None:
            return None
        fields, worked, after = step
        fields.update(P=P, X=X, C=C, a=total, b=after)
        sentences.append(rng.choice(EVENTS[kind][split]).format(**fields))
        lines += [w.format(**fields) for w in worked]
        kinds.append(kind)
        total = after
    if split == "train" and set(zip(kinds, kinds[1:])) & HELD_PAIRS:
        return None                                  # a held-out pair in a training chain
    share = [k for k in range(2, 10) if total % k == 0 and total // k > 1]
    if share and rng.random() < 0.3:
        k = rng.choice(share)
        sentences.append(rng.choice(SHARE[split]).format(P=P, X=X, k=k))
        lines.append(f"Each group gets {total} / {k} = {total // k} {X}.")
        total //= k
    else:
        sentences.append(rng.choice(QUESTIONS[split]).format(P=P, X=X))
    return _problem(" ".join(sentences), lines, total, "chain")


# --- two-quantity stories -------------------------------------------------------------------------

def change(rng, split):
    """Buying at a price, paying with a bill."""
    num = Numbers(rng, split)
    P, X = pick(rng, split, NAMES), pick(rng, split, ITEMS)
    k, m = num(2, 9), num.main(2, 12)
    cost = k * m
    bill = next(b for b in (10, 20, 100, 200, 500, 1000) if b > cost)   # no $50 bill: 50 is in HELD_BAND
    q = {"train": f"{P} buys {k} {X} that cost ${m} each and pays with a ${bill} bill. How much change does {P} get?",
         "heldout": f"Each of the {k} {X} that {P} picks out costs ${m}. {P} hands over ${bill}. What change comes back?"}
    return _problem(q[split], [f"The {X} cost {k} * {m} = ${cost}.", f"The change is {bill} - {cost} = ${bill - cost}."],
                    bill - cost, "change")


def more_than(rng, split):
    num = Numbers(rng, split)
    A, B = two_names(rng, split)
    X = pick(rng, split, ITEMS)
    n, d = num.main(5, 99), num(2, 40)
    q = f"{A} has {n} {X}. {B} has {d} more {X} than {A}. How many {X} do they have together?"
    return _problem(q, [f"{B} has {n} + {d} = {n + d} {X}.", f"Together they have {n} + {n + d} = {2 * n + d} {X}."],
                    2 * n + d, "more_than")


def times_as_many(rng, split):
    num = Numbers(rng, split)
    A, B = two_names(rng, split)
    X = pick(rng, split, ITEMS)
    n, k = num.main(3, 99), num(2, 5)
    q = f"{A} has {n} {X}. {B} has {k} times as many {X} as {A}. How many {X} do they have in total?"
    return _problem(q, [f"{B} has {n} * {k} = {n * k} {X}.", f"In total they have {n} + {n * k} = {n + n * k} {X}."],
                    n + n * k, "times_as_many")


def rate(rng, split):
    num = Numbers(rng, split)
    P = pick(rng, split, NAMES)
    n, d = num.main(3, 99), num(2, 9)
    what = rng.choice([("reads", "pages"), ("walks", "kilometers"), ("saves", "dollars"), ("bakes", "cookies")])
    q = f"{P} {what[0]} {n} {what[1]} every day. How many {what[1]} does {P} {what[0][:-1]} in {d} days?"
    return _problem(q, [f"In {d} days {P} {what[0]} {n} * {d} = {n * d} {what[1]}."], n * d, "rate")


def wages(rng, split):
    num = Numbers(rng, split)
    P = pick(rng, split, NAMES)
    r, h, d = num(5, 30), num(2, 8), num(2, 6)
    q = f"{P} earns ${r} an hour and works {h} hours a day. How much does {P} earn in {d} days?"
    return _problem(q, [f"Each day {P} earns {r} * {h} = ${r * h}.", f"In {d} days {P} earns {r * h} * {d} = ${r * h * d}."],
                    r * h * d, "wages")


def money_left(rng, split):
    num = Numbers(rng, split)
    P, X = pick(rng, split, NAMES), pick(rng, split, ITEMS)
    k, c = num(2, 9), num(2, 15)
    m = num.main(k * c + 1, max(k * c + 1, 99)) if k * c < 99 else num(k * c + 1, k * c + 60)
    q = f"{P} has ${m}. {P} buys {k} {X} for ${c} each. How much money does {P} have left?"
    return _problem(q, [f"The {X} cost {k} * {c} = ${k * c}.", f"{P} has {m} - {k * c} = ${m - k * c} left."],
                    m - k * c, "money_left")


# Held-out story kinds: the same arithmetic in stories no training problem tells.

def fewer_than(rng, split):
    num = Numbers(rng, split)
    A, B = two_names(rng, split)
    X = pick(rng, split, ITEMS)
    n = num.main(10, 99)
    d = num(2, n - 2)
    q = f"{A} collected {n} {X}, and {B} collected {d} fewer {X} than {A}. How many {X} did the two collect altogether?"
    return _problem(q, [f"{B} collected {n} - {d} = {n - d} {X}.", f"Altogether they collected {n} + {n - d} = {2 * n - d} {X}."],
                    2 * n - d, "fewer_than")


def pages_left(rng, split):
    num = Numbers(rng, split)
    P = pick(rng, split, NAMES)
    n, d = num.main(3, 60), num(2, 9)
    total = n * d + num(5, 150)
    q = f"A book has {total} pages. {P} reads {n} pages a day for {d} days. How many pages are still unread?"
    return _problem(q, [f"{P} reads {n} * {d} = {n * d} pages.", f"There are {total} - {n * d} = {total - n * d} pages left."],
                    total - n * d, "pages_left")


def shared_bill(rng, split):
    num = Numbers(rng, split)
    k = num(2, 6)
    each = rng.choice([t for t in HELD_BAND if t % k == 0]) // k if split == "heldout" else num(5, 99)
    tip = num(1, 9)
    q = f"{k} friends split a dinner bill of ${each * k} equally, and each friend also adds a ${tip} tip. How much does each friend pay?"
    return _problem(q, [f"Each share of the bill is {each * k} / {k} = ${each}.", f"With the tip each pays {each} + {tip} = ${each + tip}."],
                    each + tip, "shared_bill")


def _problem(question: str, lines: list[str], answer: int, kind: str) -> dict:
    return {"question": question, "answer": "\n".join(lines) + f"\n#### {answer}", "target": str(answer), "kind": kind}


KINDS: dict[str, list[Callable]] = {
    "train": [chain, chain, chain, change, more_than, times_as_many, rate, wages, money_left],
    "heldout": [chain, fewer_than, pages_left, shared_bill, change],
}


def generate(rng: random.Random, split: str = "train") -> dict:
    """One problem of `split` ('train' or 'heldout')."""
    while True:
        try:
            problem = rng.choice(KINDS[split])(rng, split)
        except Redraw:
            continue
        if problem is not None and int(problem["target"]) >= 0:
            return problem


def drill_line(rng: random.Random) -> str:
    """One arithmetic fact of the kinds the worked steps use ("57 * 3 = 171"), for the drill rows
    that give the small model many more results to learn from than the problems' few. Every number
    may appear here, HELD_BAND's included: this is the arithmetic the held-out problems share by
    design, not a question."""
    op = rng.choice("+-*/")
    if op == "+":
        a, b = rng.randint(2, 999), rng.randint(1, 99)
        return f"{a} + {b} = {a + b}"
    if op == "-":
        a = rng.randint(3, 999)
        b = rng.randint(1, min(a - 1, 999))
        return f"{a} - {b} = {a - b}"
    if op == "*":
        k = rng.randint(2, 9)
        m = rng.randint(2, 999 // k)
        return f"{m} * {k} = {m * k}" if rng.random() < 0.5 else f"{k} * {m} = {k * m}"
    k = rng.randint(2, 9)
    q = rng.randint(2, 999 // k)
    return f"{q * k} / {k} = {q}"


def distinct_draws(draw: Callable[[random.Random], dict], key: str, n: int, seed: int) -> list[dict]:
    """n draws with distinct `key`, from random.Random(seed): the same list for a given seed."""
    rng, seen, out = random.Random(seed), set(), []
    while len(out) < n:
        item = draw(rng)
        if item[key] not in seen:
            seen.add(item[key])
            out.append(item)
    return out


def held_out_set(n: int, seed: int = 2026) -> list[dict]:
    """The `tiny-gsm` test set: n distinct held-out problems, the same for a given seed."""
    return distinct_draws(lambda rng: generate(rng, "heldout"), "question", n, seed)
