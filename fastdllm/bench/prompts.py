"""Built-in prompt sets for `fastdllm bench`, written for this project, each with its quality signal.

    code   Python function headers (the built-in model's training format: a `def` line, the body
           follows); quality = share of outputs where prompt + completion parses as Python
    math   word problems in a two-shot "Question/Answer ... The answer is N." format;
           quality = share whose first "The answer is N" (else the last number) is correct
    chat   short instructions; no quality signal
    tasks  the built-in model's graded tasks, alternating: held-out word problems (tiny-gsm, the
           "Question: ...\nAnswer:" prompt) and function tasks (tiny-code); quality = share right
           (the number after `####`; the body passing the task's tests in a guarded child process)
    infill prefix/suffix pairs cut from the built-in model's held-out stdlib modules (infilling: the
           answer is decoded between them); quality = share where prefix + answer + suffix parses

A check takes (prompt, completion, reference) and says whether the output passes; quality is the share
that passes. In an infilling set the completion a check sees is the answer followed by its suffix
(a hole between whole lines filled with whole lines: `in_place`).

The infill pairs are cut when the set is first asked for, from the held-out modules
(training.data.HELD_OUT) of the running interpreter's stdlib, so they depend on the Python version
(bench records it). Files in sorted path order; in each, functions in the order training.data.functions
yields them (ast.walk: breadth-first, so module-level functions before methods, each level in source
order). A function gives a pair when its body's last line is a one-line `return <value>` statement and
what lies between the header (with the docstring, if any) and that line is 1 to 8 lines holding at
least one statement: prefix = header (+ docstring), reference = those lines, suffix = the return line.
The first 16 pairs form the set.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from ..errors import UsageError
from ..units import plural

CODE = [
    "def clamp(value, low, high):\n",
    "def is_palindrome(text):\n",
    "def flatten(items):\n",
    "def count_words(text):\n",
    "def read_lines(path):\n",
    "def factorial(n):\n",
    "def merge_dicts(first, second):\n",
    "def chunks(seq, size):\n",
    "def unique(items):\n",
    "def parse_bool(value):\n",
    "def gcd(a, b):\n",
    "def strip_comments(line):\n",
    "def find_index(items, target):\n",
    "def to_snake_case(name):\n",
    "def mean(numbers):\n",
    "def invert_mapping(mapping):\n",
]

_MATH_SHOTS = (
    "Question: Tom has 3 boxes with 4 apples in each box. He eats 2 apples. How many apples are left?\n"
    "Answer: 3 boxes of 4 apples is 12 apples. After eating 2, 12 - 2 = 10. The answer is 10.\n\n"
    "Question: A book costs 7 dollars. Ana buys 3 books and pays with a 50 dollar bill. How much change does she get?\n"
    "Answer: 3 books cost 3 * 7 = 21 dollars. The change is 50 - 21 = 29. The answer is 29.\n\n"
)

# (question, answer): small integers, one or two steps each
_MATH = [
    ("A farmer has 12 cows and buys 5 more. Then he sells 4. How many cows does he have?", 13),
    ("There are 6 rows of chairs with 8 chairs in each row. How many chairs are there?", 48),
    ("Mia reads 15 pages a day. How many pages does she read in 4 days?", 60),
    ("A pizza is cut into 8 slices. Three friends eat 2 slices each. How many slices are left?", 2),
    ("Sam has 45 marbles and gives 9 to each of his 3 sisters. How many marbles does he keep?", 18),
    ("A train travels 60 kilometres per hour for 3 hours. How far does it go?", 180),
    ("Lena saves 5 dollars every week. How many weeks does she need to save 35 dollars?", 7),
    ("A class has 28 students. Half of them walk to school. How many students walk?", 14),
    ("A shop sells pens in packs of 6. How many pens are in 7 packs?", 42),
    ("Ben is 9 years old. His mother is 4 times as old. How old is his mother?", 36),
    ("A tank holds 100 litres. 35 litres are used in the morning and 20 in the evening. How many litres remain?", 45),
    ("Each bag holds 5 oranges. How many bags are needed for 40 oranges?", 8),
]

CHAT = [
    "Give three tips for writing clear emails.",
    "Explain what a hash table is in two sentences.",
    "Write a haiku about autumn rain.",
    "What is the difference between a list and a tuple in Python?",
    "Summarise the water cycle for a ten-year-old.",
    "Suggest a name for a small bakery and explain why.",
    "List four ways to reduce household energy use.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Why is the sky blue? Answer briefly.",
    "Write a polite reply declining a meeting invitation.",
    "Describe a healthy breakfast in one paragraph.",
    "What are the main causes of inflation?",
]


def parses_as_python(prompt: str, completion: str, reference=None) -> bool:
    """prompt + completion is accepted by `ast.parse`; with a fenced answer (chat models), the
    fenced code alone."""
    fenced = re.search(r"```(?:python|py)?\n(.*?)(?:```|$)", completion, re.S)
    try:
        ast.parse(fenced.group(1) if fenced else prompt + completion)
        return True
    except (SyntaxError, ValueError):
        return False


def final_number(text: str) -> int | None:
    """The number after the first "answer is", else the last number (before any invented next question)."""
    text = text.split("Question:")[0]
    stated = re.search(r"answer is\s*\$?(-?\d[\d,]*)", text)
    numbers = re.findall(r"-?\d[\d,]*", text)
    raw = (stated.group(1) if stated else numbers[-1] if numbers else "").replace(",", "")
    return int(raw) if raw.lstrip("-").isdigit() else None


def is_correct(prompt: str, completion: str, reference=None) -> bool:
    return final_number(completion) == reference


TASKS_DIR = Path(__file__).resolve().parents[1] / "eval" / "builtin_tasks"   # the graded tasks' data


def tasks_set(n: int = 8) -> PromptSet:
    """n word problems and n function tasks from the built-in graded tasks, alternating."""
    read = lambda name: [json.loads(line) for line in (TASKS_DIR / name).read_text().splitlines()[:n]]
    prompts, references = [], []
    for problem, task in zip(read("tiny_gsm.jsonl"), read("tiny_code.jsonl")):
        prompts += [f"Question: {problem['question']}\nAnswer:", task["prompt"]]
        references += [int(problem["target"]), task]
    return PromptSet("tasks", prompts, references=references, quality_metric="right", check=task_passes)


def task_passes(prompt: str, completion: str, reference=None) -> bool:
    """A word problem: the number after `####` is the target; a function task: its tests pass."""
    if isinstance(reference, int):
        found = re.search(r"####\s*\$?(-?[\d,]+)", completion)
        return found is not None and found.group(1).replace(",", "") == str(reference)
    from ..code_execution import passes

    program = prompt + completion + "\n" + reference["test"] + f"\ncheck({reference['entry_point']})\n"
    return passes(program, timeout=5.0)[0]


def in_place(prefix: str, fill: str, suffix: str) -> str:
    """The fill followed by its suffix. A hole cut between whole lines (the prefix ends a line, the
    suffix starts one) is filled with whole lines: trailing spaces dropped and a final newline added
    where the model left none (a fixed-length hole rarely ends exactly at a line's end)."""
    if prefix.endswith("\n") and not suffix.startswith("\n"):
        fill = fill.rstrip(" \t")
        fill += "" if fill.endswith("\n") or not fill else "\n"
    return fill + suffix


@dataclass(frozen=True)
class PromptSet:
    name: str
    prompts: list[str]
    references: list | None = None         # per prompt, for the quality check (math: the answer)
    quality_metric: str | None = None      # the quality column's name
    check: Callable[[str, str, object], bool] | None = None
    suffixes: list[str] | None = None      # infilling: the answer is decoded between prompt and suffix

    def quality(self, completions: list[str]) -> float | None:
        """Share of completions that pass the set's check; None when the set defines none."""
        if self.check is None:
            return None
        refs = self.references or [None] * len(self.prompts)
        if self.suffixes is not None:
            # an infilled answer is judged in place, with the text that must follow it: the checks keep
            # one signature and `references` stays free for the reference answers
            completions = [in_place(p, c, s) for p, c, s in zip(self.prompts, completions, self.suffixes)]
        return sum(map(self.check, self.prompts, completions, refs)) / max(len(completions), 1)

    def take(self, n: int | None) -> "PromptSet":
        """The first n prompts (all when n is None)."""
        if n is None:
            return self
        if n < 1:
            raise UsageError(f"--n-prompts {n}: give at least 1")
        if n > len(self.prompts):
            raise UsageError(f"--n-prompts {n}: the '{self.name}' set has {plural(len(self.prompts), 'prompt')}")
        return replace(self, prompts=self.prompts[:n], references=self.references and self.references[:n],
                       suffixes=self.suffixes and self.suffixes[:n])


N_INFILL = 16


def infill_pair(header: str, body: str) -> tuple[str, str, str] | None:
    """(prefix, middle, suffix) of one function (training.data.functions' header and body) under the
    rule in the module docstring; None when the function does not fit it."""
    text = header + body
    try:
        fn = ast.parse(text).body[0]
    except (SyntaxError, ValueError):     # a function dedent could not flatten: skipped
        return None
    lines = text.splitlines(keepends=True)
    last = fn.body[-1]
    if not (isinstance(last, ast.Return) and last.value is not None and last.lineno == last.end_lineno
            and lines[last.lineno - 1].lstrip().startswith("return")):     # not `x = 1; return x`
        return None
    doc = ast.get_docstring(fn, clean=False) is not None
    start = fn.body[0].end_lineno if doc else len(header.splitlines())
    end = last.lineno - 1
    if not fn.body[1 if doc else 0:-1] or not 1 <= end - start <= 8:
        return None
    return "".join(lines[:start]), "".join(lines[start:end]), lines[end]


@functools.cache
def infill_set() -> PromptSet:
    """The "infill" set, cut from the stdlib on first use (importing this module reads no files)."""
    from ..training.data import corpus_files, functions, read

    pairs = []
    for path in corpus_files()[1]:                    # held-out files, sorted
        pairs += filter(None, (infill_pair(h, b) for h, b in functions(read(path))))
    pairs = pairs[:N_INFILL]
    return PromptSet("infill", [p for p, _, _ in pairs], references=[m for _, m, _ in pairs],
                     quality_metric="parses", check=parses_as_python, suffixes=[s for _, _, s in pairs])


SETS = {
    "code": PromptSet("code", CODE, quality_metric="parses", check=parses_as_python),
    "math": PromptSet("math", [_MATH_SHOTS + f"Question: {q}\nAnswer:" for q, _ in _MATH],
                      references=[a for _, a in _MATH], quality_metric="correct", check=is_correct),
    "chat": PromptSet("chat", CHAT),
    "infill": infill_set,                 # built when first asked for: it reads the stdlib
    "tasks": tasks_set,                   # ... and this one the graded tasks' files
}


def default_set(model_dir: Path, chat: bool) -> str:
    """The set a model declares (generation_config.json's `fastdllm_prompt_set`: the built-in
    model's graded tasks), else chat prompts for a chat model, else code."""
    try:
        declared = json.loads((Path(model_dir) / "generation_config.json").read_text()).get("fastdllm_prompt_set")
    except (OSError, ValueError, AttributeError):
        declared = None
    return declared if declared in SETS else "chat" if chat else "code"


def builtin(name: str) -> PromptSet:
    if name not in SETS:
        raise UsageError(f"unknown prompt set '{name}' (available: {', '.join(SETS)})")
    found = SETS[name]
    return found if isinstance(found, PromptSet) else found()


def from_file(path: Path) -> PromptSet:
    """JSONL with a "prompt" field per line, or one prompt per line (blank lines skipped). JSONL lines
    that also carry a "suffix" make an infilling set; then every line needs one."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read prompts file {path}: {e}") from None
    prompts, suffixes, numbers = [], [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        suffix = None
        if path.suffix == ".jsonl" or line.lstrip().startswith("{"):
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"{path}:{number}: not valid JSON ({e.msg})") from None
            if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
                raise UsageError(f'{path}:{number}: expected an object with a "prompt" string')
            line, suffix = item["prompt"], item.get("suffix")
            if suffix is not None and not (isinstance(suffix, str) and suffix):
                raise UsageError(f'{path}:{number}: "suffix" must be a non-empty string')
        prompts.append(line)
        suffixes.append(suffix)
        numbers.append(number)
    if not prompts:
        raise UsageError(f"{path} holds no prompts")
    infilling = [s is not None for s in suffixes]
    if any(infilling) and not all(infilling):
        odd = numbers[infilling.index(not infilling[0])]          # the first line unlike the first one
        raise UsageError(f'{path}:{odd}: {"no" if infilling[0] else "a"} "suffix", unlike line {numbers[0]}: '
                         f'give every line a "suffix" (infilling) or none')
    return PromptSet(path.name, prompts, suffixes=suffixes if all(infilling) else None)
