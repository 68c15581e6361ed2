"""The rows `fastdllm eval` runs: profiles, or a suite's rows followed by profiles, each at every
`--gen-lens` length. A suite is bench's (fastdllm/bench/suite.py: `paper`, `accelerators`): the same
row table, resolved for the model by bench's own code (suite_table, expand_kept, applicable), so a
row the model or a length refuses is left out with the reason, as in `bench --suite`. The first
row at each length is the reference of that length's speed-ups (tasks.compare)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from fastdllm.errors import UsageError

# decoding flags that bench takes as its sweep (over every row) rather than as a row's value
SWEPT = ("gen_len", "block_len", "threshold", "factor", "early_stop")


def lengths(text: str | None) -> tuple[int, ...] | None:
    """--gen-lens 256,512 -> (256, 512); None when not given."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() and int(t) >= 1 for t in items):
        raise UsageError(f"--gen-lens {text}: expected answer lengths >= 1, comma list (e.g. 256,512)")
    return tuple(dict.fromkeys(int(t) for t in items))


def label(name: str, length: int | None) -> str:
    return f"{name}@{length}" if length else name


@dataclass
class Plan:
    """What eval runs, resolved before the model loads (every usage error said then); `settings`
    adds what the loaded model refuses."""
    suite: str | None
    cases: list                                  # the suite's bench Cases, length by length
    profiles: dict                               # length (None: the tasks' own) -> [(name, DecodeConfig)]
    lengths: tuple[int, ...] | None
    left_out: list[str]
    notes: list[str]

    def settings(self, lm, chat: bool) -> list:
        """The rows to run (tasks.Setting), length by length: the suite's rows the model decodes,
        then the profiles. A suite row the engine refuses joins `left_out`."""
        from fastdllm.bench import prompts
        from fastdllm.bench.suite import SUITE_DEFAULTS, applicable
        from fastdllm.eval.tasks import Setting

        cases = self.cases
        if cases:                                # bench's check: a batch of a stand-in prompt set up, not run
            stand_in = prompts.builtin(SUITE_DEFAULTS[self.suite].get("prompt_set", "math")).take(1)
            cases, refused = applicable(lm, cases, stand_in, chat)
            self.left_out += refused
            if not cases and not any(self.profiles.values()):
                raise UsageError(f"no row of the suite {self.suite} applies to this model ({refused[0]})")
        out = []
        for length in self.lengths or [None]:
            out += [Setting(label(c.name, length), c.cfg, length) for c in cases
                    if length is None or c.cfg.gen_len == length]
            out += [Setting(label(name, length), cfg, length) for name, cfg in self.profiles[length]]
        return out


def plan(model_dir: Path | None, suite: str | None, profile_names: list[str] | None, decode: dict,
         gen_lens: tuple[int, ...] | None) -> Plan:
    """Suite rows and profiles resolved at each length. Without --suite or --profiles: the model's
    default profile, as before suites. Decoding flags apply on top of every profile; on a suite's
    rows they fill what the row leaves open (a row's own cache and rule are what it measures), and
    --threshold / --factor / --block-len act as bench's sweep flags do."""
    from fastdllm.decode import profiles

    if gen_lens and decode.get("gen_len") is not None:
        raise UsageError("give --gen-len N or --gen-lens N,M, not both (--gen-lens sets every row's length)")
    cases, left_out, notes, taken = [], [], [], set()
    if suite:
        cases, left_out, notes = suite_cases(suite, model_dir, decode, gen_lens)
        taken = {c.name for c in cases}
    names = profile_names or ([] if suite else [profiles.default_profile_for(model_dir)])
    found = [profiles.find(p) for p in names]
    per_length = {}
    for length in gen_lens or [None]:
        per_length[length] = []
        for p in found:
            name = p.name if p.name not in taken else f"profile:{p.name}"    # as bench names it
            try:
                cfg = profiles.resolve(p, {**decode, **({"gen_len": length} if length else {})}, model_dir)
            except UsageError as e:
                raise UsageError(f"{name} at gen_len {length}: {str(e).removeprefix('flags: ')}") from None
            per_length[length].append((name, cfg))
    return Plan(suite, cases, per_length, gen_lens, left_out, notes)


def suite_cases(suite: str, model_dir: Path | None, decode: dict,
                gen_lens: tuple[int, ...] | None) -> tuple[list, list[str], list[str]]:
    """The suite's rows as bench expands them (one batch size, the --gen-lens lengths; without
    them one case per row at --gen-len or the model's gen_len, its canvas then the task's), the
    rows left out with their reasons, and a note for each decoding flag that rows override."""
    from fastdllm.bench import cases as bench_cases
    from fastdllm.bench import suite as bench_suite
    from fastdllm.decode.profiles import resolve

    table, left_out = bench_suite.suite_table(suite, model_dir)
    given = {k: v for k, v in decode.items() if v is not None and k not in SWEPT}
    notes = []
    for key in given:
        own = [row.name for row in table.values() if key in row.values]
        if own:
            notes.append(f"--{key.replace('_', '-')} does not change the rows that set it: {', '.join(own)}")
    rows = [replace(row, values={**given, **row.values}) for row in table.values()]
    fallback = (resolve(None, {"gen_len": decode.get("gen_len")}, model_dir).gen_len,)
    sweep = bench_cases.Sweep(gen_len=gen_lens or fallback, block_len=_one(decode, "block_len"),
                              threshold=_one(decode, "threshold"), factor=_one(decode, "factor"),
                              early_stop=decode.get("early_stop"))
    cases, refused = bench_suite.expand_kept(rows, sweep, model_dir)
    if not cases:
        raise UsageError(f"no row of the suite {suite} runs here: {(left_out + refused)[0]}")
    return cases, left_out + refused, notes


def _one(decode: dict, key: str) -> tuple | None:
    """A decoding flag as a one-value sweep (None: not given)."""
    return (decode[key],) if decode.get(key) is not None else None
