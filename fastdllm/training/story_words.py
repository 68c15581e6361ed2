"""Who and what a generated word problem names, and which numbers it may hold, per split
(word_problems.py tells the stories). The held-out split (the `tiny-gsm` task) has people, things
and containers of its own, and a number from HELD_BAND in every question; training questions never
hold one. Training draws often take made-up words instead of the fixed lists (NOVEL_SHARE).
"""

from __future__ import annotations

import random

HELD_BAND = range(41, 61)          # no training question holds one of these numbers; every held-out one does

NAMES = {"train": ["Mia", "Leo", "Ava", "Sam", "Nora", "Omar", "Lily", "Ben", "Zoe", "Max", "Ella", "Jack",
                   "Ruby", "Finn", "Sara", "Luca", "Ivy", "Noah", "Emma", "Adam", "Hana", "Tom", "Rosa", "Kai"],
         "heldout": ["Priya", "Diego", "Greta", "Tariq", "Yuki", "Olga", "Mateo", "Amara", "Felix", "Ines"]}
ITEMS = {"train": ["apples", "stickers", "marbles", "pencils", "cookies", "books", "stamps", "shells", "cards",
                   "flowers", "coins", "eggs", "toys", "candies", "buttons", "rocks", "balloons", "beads"],
         "heldout": ["lemons", "crayons", "tickets", "feathers", "magnets", "acorns", "ribbons", "muffins"]}
CONTAINERS = {"train": ["bags", "boxes", "jars", "baskets"], "heldout": ["crates", "tins"]}


class Redraw(Exception):
    """This draw cannot be finished within the split's rules: draw another problem."""


class Numbers:
    """Numbers for one problem: training questions never hold a HELD_BAND number; a held-out question
    gets one as its first main quantity (`main`)."""

    def __init__(self, rng: random.Random, split: str):
        self.rng, self.split, self.band_used = rng, split, False

    def __call__(self, lo: int, hi: int) -> int:
        for _ in range(100):
            n = self.rng.randint(lo, hi)
            if self.split == "heldout" or n not in HELD_BAND:
                return n
        raise Redraw

    def main(self, lo: int = 5, hi: int = 99) -> int:
        if self.split == "heldout" and not self.band_used:
            self.band_used = True
            return self.rng.choice(HELD_BAND)
        return self(lo, hi)


# Share of training people and things that are made-up words (novel_word) rather than the fixed
# lists: with 24 names a small model learns the 24 and writes the commonest one whatever the question
# says (docs/builtin-model-training.md, third session); with names it cannot have memorised, the only
# way to get the worked answer right is to copy them from the question, which is what held-out
# problems need. Held-out draws never take this path (the `tiny-gsm` set stays as published).
NOVEL_SHARE = 0.6
# Onsets and vowels cover the letters held-out names use (Yuki, Felix, Tariq, ...), so that every
# letter piece has been copied somewhere in training, without ever spelling a held-out word.
SYLLABLES = [c + v for c in ("b c d f g h j k l m n p qu r s t v w x y z br ch cr dr gr kl pr sh st th tr"
                             .split()) for v in ("a", "e", "i", "o", "u", "y", "ai", "ea", "ou")]
HELD_OUT_WORDS = {w.lower() for lists in (NAMES, ITEMS, CONTAINERS) for w in lists["heldout"]}


def novel_word(rng: random.Random) -> str:
    """A made-up word of 2-3 syllables ("kamuri", "thyxeal"), never a held-out name or thing."""
    while True:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))) + rng.choice(["", "", "n", "r", "l", "s", "x", "k", "q"])
        if word not in HELD_OUT_WORDS and word + "s" not in HELD_OUT_WORDS:
            return word


def pick(rng: random.Random, split: str, options: dict[str, list[str]]) -> str:
    """A name (NAMES), a thing (ITEMS, plural) or a container for a problem of `split`."""
    if split == "train" and options is not CONTAINERS and rng.random() < NOVEL_SHARE:
        word = novel_word(rng)
        return word.capitalize() if options is NAMES else word + "s"
    return rng.choice(options[split])


def two_names(rng: random.Random, split: str) -> tuple[str, str]:
    """Two different people (held-out draws exactly as the published `tiny-gsm` set was drawn)."""
    if split != "train":
        return tuple(rng.sample(NAMES[split], 2))
    first = pick(rng, split, NAMES)
    while (second := pick(rng, split, NAMES)) == first:
        pass
    return first, second
