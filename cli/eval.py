"""`fastdllm eval`: task metrics beside speed for each profile or suite row (cli/eval_rows.py), on
lm-evaluation-harness (fastdllm/eval/tasks.py). Progress on stderr; results (table, Markdown,
JSON, CSV) on stdout or in a file, rewritten as each (task, row) finishes and kept when interrupted.

Data parallel: under `torchrun` / `accelerate launch` (or `--num-processes N`, which starts
torchrun's machinery) each process loads the model on its own device and takes its share of every
task's documents; rank 0 alone prints and writes (fastdllm/eval/distributed.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from fastdllm.checkpoints.locate import resolve_model_dir
from fastdllm.errors import UsageError, UserError

from . import eval_rows, parallel
from .model import load_model
from .options import MODEL_FLAGS, comma_names, decoding_options, model_placement
from .results import check_writable, output_and_format
from .results import save as save_records
from .terminal import err_console, is_terminal, out_console
from .user_errors import needs_extra, user_errors

EXAMPLES = """Examples:

  fastdllm eval --include-path examples/eval --tasks next_line --profiles baseline,fast --limit 20

  fastdllm eval -m ~/models/LLaDA-8B-Instruct --tasks gsm8k --num-fewshot 5 --profiles baseline,default

  fastdllm eval --tasks tiny-gsm --suite paper --gen-lens 256,512 --limit 20 --format md

  torchrun --nproc-per-node 8 -m fastdllm eval -m ~/models/LLaDA-8B-Instruct --tasks gsm8k --num-fewshot 5
"""


@user_errors
@decoding_options
def eval_(
    tasks: Annotated[list[str], typer.Option("--tasks", "-t", help="lm-eval task names, comma list (or repeated).")],
    profiles_: Annotated[Optional[list[str]], typer.Option("--profiles", "-P", help="Profiles to compare, comma list; the first is the reference (default: the model's default profile; with --suite, after the suite's rows).")] = None,
    suite: Annotated[Optional[str], typer.Option("--suite", help="Run a suite's rows, as `bench --suite` resolves them for the model: paper (the Fast-dLLM paper's Table 1: baseline, parallel, parallel-factor, prefix, dual, dual+parallel, dual+factor) | accelerators. The first row is the reference.")] = None,
    gen_lens: Annotated[Optional[str], typer.Option("--gen-lens", help="Answer lengths, comma list (256,512): every row at each, replacing the tasks' max_gen_toks; rows named ROW@LEN, speed-ups against the first row at the same length.")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="At most N documents per task.")] = None,
    num_fewshot: Annotated[Optional[int], typer.Option("--num-fewshot", help="Few-shot examples (default: the task's).")] = None,
    include_path: Annotated[Optional[list[Path]], typer.Option("--include-path", help="A folder of local task YAMLs (repeatable).")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the results to this file (rewritten as each task x profile finishes).")] = None,
    output_format: Annotated[Optional[str], typer.Option("--format", help="table | md | json | csv (default: from --output's suffix, else table).")] = None,
    chat: Annotated[bool, typer.Option("--chat/--raw", help="Apply the model's chat template to the task prompts (lm-eval's --apply_chat_template).")] = False,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Requests decoded together (left padding).")] = 1,
    mc_num: Annotated[int, typer.Option("--mc-num", help="Likelihood tasks: Monte Carlo samples per continuation (LLaDA's estimate).")] = 128,
    mc_batch: Annotated[int, typer.Option("--mc-batch", help="Likelihood tasks: samples per forward (divides --mc-num).")] = 32,
    check_greedy: Annotated[bool, typer.Option("--check-greedy/--no-check-greedy", help="Likelihood tasks: also decide whether the continuation is the greedy one (L forwards; multiple-choice tasks never read it).")] = True,
    unsafe: Annotated[bool, typer.Option("--confirm-run-unsafe-code", help="Allow tasks that run the generated code (HumanEval, MBPP; their metric also needs HF_ALLOW_CODE_EVAL=1).")] = False,
    num_processes: Annotated[Optional[int], typer.Option("--num-processes", help="Data parallel: N processes, one per GPU (or sharing the CPU cores), each with its share of every task; as `torchrun --nproc-per-node N -m fastdllm eval ...`.")] = None,
    model: Annotated[Optional[str], MODEL_FLAGS["model"][1]] = None,
    dtype: Annotated[Optional[str], MODEL_FLAGS["dtype"][1]] = None,
    device: Annotated[Optional[str], MODEL_FLAGS["device"][1]] = None,
    quantize: Annotated[Optional[str], MODEL_FLAGS["quantize"][1]] = None,
    device_map: Annotated[Optional[str], MODEL_FLAGS["device_map"][1]] = None,
    max_memory: Annotated[Optional[str], MODEL_FLAGS["max_memory"][1]] = None,
    *, decode: dict,
):
    """Evaluate profiles or a suite's rows on lm-evaluation-harness tasks: each task's metric with its
    standard error beside answer tokens/s, NFE per answer and tokens per forward, against the first
    row. Decoding flags (--threshold, --gen-len, ...) apply on top of every profile (a suite's rows
    keep the cache and rule they are named for); --gen-lens sets the canvas of every task, else a
    task's max_gen_toks, else --gen-len / the profile's gen_len."""
    import os

    os.environ.setdefault("TQDM_DISABLE", "1")     # lm-eval's own bars; read when tqdm is first imported
    parallel.quiet_followers()
    from fastdllm.eval.format import FORMATS, SUFFIXES

    output, output_format = output_and_format(output, output_format, FORMATS)
    fmt = output_format or (SUFFIXES.get(output.suffix.lower()) if output else "table")
    if fmt not in FORMATS:
        raise UsageError(f"--format {output_format}: expected one of {', '.join(FORMATS)}" if output_format else
                         f"cannot tell the format of {output} from its suffix: pass --format {'|'.join(FORMATS)}")
    check_writable(output, "--output")
    for name, value, low in (("--limit", limit, 1), ("--num-fewshot", num_fewshot, 0), ("--batch-size", batch_size, 1)):
        if value is not None and value < low:
            raise UsageError(f"{name} {value}: give at least {low}")
    if mc_num < 1 or mc_batch < 1 or mc_num % mc_batch:
        raise UsageError(f"--mc-num {mc_num} must be a positive multiple of --mc-batch {mc_batch}")
    lengths = eval_rows.lengths(gen_lens)
    placement = model_placement(dtype=dtype, device=device, quantize=quantize, device_map=device_map,
                                max_memory=max_memory)
    if importlib.util.find_spec("lm_eval") is None:     # said once, not by each process of a parallel run
        raise UserError(needs_extra("lm_eval", "eval"))
    if parallel.wanted(num_processes):                   # the processes check the rest; rank 0 speaks
        raise typer.Exit(parallel.launch(num_processes))
    from fastdllm.eval import tasks as evaluate

    task_names = comma_names(tasks)
    model_dir = resolve_model_dir(model)
    # --suite and --profiles: the suite's rows, then the profiles, all against the suite's first row
    plan = eval_rows.plan(model_dir, suite, comma_names(profiles_), decode, lengths)
    for line in plan.notes:
        err_console.print(f"note: {line}", style="yellow")
    manager = evaluate.task_manager(include_path or [], task_names)
    options = evaluate.Options(limit=limit, num_fewshot=num_fewshot, chat=chat, confirm_run_unsafe_code=unsafe,
                               batch_size=batch_size, mc_num=mc_num, mc_batch=mc_batch, check_greedy=check_greedy)
    world = parallel.join(num_processes, placement)
    lm = load_model(model_dir, **placement)
    if chat and not lm.has_chat_template:
        raise UserError(f"{lm.path.name} has no chat template: run without --chat")
    configs = plan.settings(lm, chat)
    for line in plan.left_out:
        err_console.print(f"left out: {line}", style="yellow")
    err_console.print(f"eval: {len(task_names)} task(s) x {len(configs)} row(s) on {lm.path.name}"
                      + (f", {world.size} processes" if world.size > 1 else ""), style="dim")
    records, stopped = [], None
    try:
        with Progress() as progress:
            for r in evaluate.run(lm, task_names, configs, manager, options, progress=progress.update, world=world):
                records.append(r)
                progress.finished(r)
                if output is not None:
                    save(evaluate.compare(records), fmt, output)
    except (KeyboardInterrupt, Exception) as e:          # keep the finished pairs
        stopped = e
        if records:
            what = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
            err_console.print(f"{what}: keeping the {len(records)} finished task x profile results", style="yellow")
    if records:
        emit(evaluate.compare(records), fmt, output)
    if isinstance(stopped, KeyboardInterrupt):
        raise typer.Exit(130)
    if stopped is not None:
        raise stopped


class Progress:
    """A rich bar per (task, profile) on a terminal (stderr); elsewhere one line per finished pair."""

    def __init__(self):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as Bar

        self.bar = (Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err_console, transient=True) if err_console.is_terminal else None)
        self.current = None

    def __enter__(self):
        if self.bar:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar:
            self.bar.__exit__(*exc)
        return False

    def update(self, label: str, done: int, total: int) -> None:
        if not self.bar:
            return
        if self.current is None or self.current[0] != label:
            self.current = (label, self.bar.add_task(label, total=total))
        self.bar.update(self.current[1], completed=done, total=total)

    def finished(self, r: dict) -> None:
        stderr = "" if r["stderr"] is None else f" ± {r['stderr']:.4f}"
        err_console.print(f"{r['task']} · {r['profile']}: {r['metric']} {r['value']:.4f}{stderr} · "
                          f"{r['tokens_per_second'] or 0:.1f} tok/s · {r['seconds']:.1f} s", style="dim")


def save(records: list[dict], fmt: str, output: Path) -> None:
    from fastdllm.eval.format import render

    save_records(records, fmt, output, render)


def emit(records: list[dict], fmt: str, output: Path | None) -> None:
    from fastdllm.eval.format import render, table

    if output is not None:
        save(records, fmt, output)
        err_console.print(f"results written to {output} ({fmt})", style="dim")
    elif fmt != "table":
        sys.stdout.write(render(records, fmt))
    elif is_terminal(sys.stdout):
        out_console.print(table(records))
    else:
        sys.stdout.write(render(records, "table"))
