"""`fastdllm bench`'s progress on stderr: a bar with ETA on a terminal, else a line per row's run."""

from __future__ import annotations

from .terminal import err_console


class RunProgress:
    """A rich progress bar with ETA on a terminal (stderr); elsewhere one line as each row starts a
    warm-up or a repetition, numbered by the runs it makes: [3-4/10] (prompts x rows x rounds)."""

    def __init__(self, total: int, n_prompts: int, warmup: int, share: tuple[int, int] = (0, 1)):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = (Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                             console=err_console, transient=True) if err_console.is_terminal else None)
        self.total, self.done, self.last = total, 0, None
        self.n_prompts, self.warmup, self.share = n_prompts, warmup, share

    def __enter__(self):
        if self.bar:
            self.bar.__enter__()
            self.task = self.bar.add_task("bench", total=self.total)
        return self.tick

    def __exit__(self, *exc):
        if self.bar:
            self.bar.__exit__(*exc)
        return False

    def tick(self, case, what: str) -> None:
        """A run of `case` has finished; `what`: "warm-up" or "rep R/N" (runner.measure_share)."""
        from fastdllm.bench.runner import runs_per_round
        from fastdllm.decode.rules import rule_fields, rule_text

        self.done += 1
        c = case.cfg
        label = f"{case.name} {rule_text(rule_fields(c))} · gen {c.gen_len} · block {c.block_len} · batch {case.batch_size}"
        runs = self.warmup if what == "warm-up" else runs_per_round(case, self.n_prompts, self.share)
        last = self.done + max(runs, 1) - 1 if (label, what) != self.last else self.done
        self.total = max(self.total, last)               # an auto round beyond the planned ones
        if self.bar:
            self.bar.update(self.task, advance=1, total=self.total, description=f"{label} · {what}")
        elif (label, what) != self.last:                 # the first run of this row's warm-up or repetition
            runs = f"{self.done}" if last == self.done else f"{self.done}-{last}"
            err_console.print(f"[{runs}/{self.total}] {label} · {what}", style="dim")
            self.last = (label, what)
