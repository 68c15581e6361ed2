"""`fastdllm bench`: run decoding configurations over a prompt set and compare them with the baseline.
Progress on stderr; results (table, Markdown, JSON, JSONL or CSV) on stdout or in a file.
Data parallel under torchrun / accelerate launch / --num-processes N (cli/parallel.py): each
process runs its share of every row's batches, rank 0 merges them into one table. Tensor parallel
(--tp N): one model split over N processes, each running every batch; rank 0 reports."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from fastdllm.checkpoints.locate import resolve_model_dir
from fastdllm.errors import UsageError
from fastdllm.units import plural

from . import parallel
from .constraint_flags import compile_for, spec_from
from .model import load_model
from .options import MODEL_FLAGS, TENSOR_PARALLEL, comma_names, model_placement
from .bench_progress import RunProgress
from .results import check_writable, output_and_format, save
from .terminal import err_console, is_terminal, out_console
from .user_errors import user_errors

DEFAULT_N_PROMPTS = 4     # built-in sets; a --prompts file runs whole


def _comma_list(text: str | None, name: str) -> tuple | None:
    """'256,512' -> (256, 512), each value checked as the DecodeConfig field `name`."""
    from fastdllm.decode.config import DecodeConfig

    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"--{name.replace('_', '-')}: give one value or a comma list")
    return tuple(dict.fromkeys(DecodeConfig.parse({name: t})[name] for t in items))


def _batch_sizes(text: str) -> tuple[int, ...]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() and int(t) >= 1 for t in items):
        raise UsageError(f"--batch-size: expected integers >= 1, got {text!r}")
    return tuple(dict.fromkeys(int(t) for t in items))


def list_configs(model: str | None, suite: str | None) -> None:
    from fastdllm.bench.cases import table_for
    from fastdllm.bench.suite import suite_table

    model_dir = resolve_model_dir(model)
    table = suite_table(suite, model_dir)[0] if suite else table_for(model_dir)
    width = max(map(len, table))
    for row in table.values():
        sys.stdout.write(f"{row.name:<{width}}  {row.doc}\n")


@user_errors
def bench(
    configs: Annotated[Optional[list[str]], typer.Option("--configs", "-c", help="Rows to run, comma list (default: all; see --list).")] = None,
    profile: Annotated[Optional[list[str]], typer.Option("--profile", "-P", help="Add a profile as a row (repeatable).")] = None,
    suite: Annotated[Optional[str], typer.Option("--suite", help="Run a suite's rows: paper (the Fast-dLLM paper's Table 1: baseline, parallel, parallel-factor, prefix, dual, dual+parallel, dual+factor; default gen_len 256,512) | accelerators (the vanilla baseline, Fast-dLLM, every accelerator alone and on Fast-dLLM; default gen_len 256,1024); both on the math prompts; rows the model refuses are left out with the reason. -c picks among them.")] = None,
    gen_len: Annotated[Optional[str], typer.Option("--gen-len", "-n", help="Generation lengths, comma list (default 256; a suite's own).")] = None,
    block_len: Annotated[Optional[str], typer.Option("--block-len", help="Block lengths, comma list (default: the model family's, 32 for LLaDA and Dream).")] = None,
    threshold: Annotated[Optional[str], typer.Option("--threshold", help="Thresholds for rows using the threshold rule, comma list.")] = None,
    factor: Annotated[Optional[str], typer.Option("--factor", help="Factors for rows using the factor rule, comma list.")] = None,
    batch_size: Annotated[str, typer.Option("--batch-size", "-b", help="Prompts decoded together, comma list.")] = "1",
    early_stop: Annotated[Optional[bool], typer.Option("--early-stop/--no-early-stop", help="Stop after the answer ends (default: on). Off decodes the whole canvas, as the paper's measurements do.")] = None,
    prompt_set: Annotated[Optional[str], typer.Option("--prompt-set", help="Built-in prompts: code | math | chat | infill | tasks (default: the set the model declares, as the built-in model declares its graded tasks; else chat if the model has a chat template, else code). tasks: held-out word problems and function tasks, graded. infill: prefix/suffix pairs from the built-in model's held-out sources, the answer decoded between them.")] = None,
    prompts_file: Annotated[Optional[Path], typer.Option("--prompts", help="Prompts file: JSONL with a \"prompt\" field (and a \"suffix\" on every line: infilling), or one prompt per line.")] = None,
    n_prompts: Annotated[Optional[int], typer.Option("--n-prompts", help=f"Use the first N prompts (default {DEFAULT_N_PROMPTS}; a --prompts file: all).")] = None,
    chat: Annotated[Optional[bool], typer.Option("--chat/--raw", help="Apply the chat template (default: if the model has one).")] = None,
    repetitions: Annotated[str, typer.Option("--repetitions", "-r", help="Timed runs of every row, interleaved across rows (median and spread of tokens/s; a speed-up marked ~ when the spreads make it unreliable). auto: 2 of every row, then up to 5 for a row whose spread is above 10% or whose speed-up is still unsettled (with its baseline).")] = "auto",
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed runs of the first batch per cache mode and shape.")] = 1,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the results to FILE (format from --format, else its suffix).")] = None,
    output_format: Annotated[Optional[str], typer.Option("--format", help="table | md | json | jsonl | csv | html (the table and a speed-up against agreement scatter, one point per row); default: from --output's suffix, else table.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Save a plot (PNG): throughput vs gen_len, speed vs agreement.")] = None,
    list_rows: Annotated[bool, typer.Option("--list", help="List the configurations and exit.")] = False,
    num_processes: Annotated[Optional[int], typer.Option("--num-processes", help="Data parallel: N processes, one per GPU (or sharing the CPU cores), each with its share of every row's batches; as `torchrun --nproc-per-node N -m fastdllm bench ...`.")] = None,
    tp: Annotated[Optional[int], TENSOR_PARALLEL] = None,
    json_schema: Annotated[Optional[Path], typer.Option("--json-schema", help="Also run every row under this JSON Schema file (a twin row ROW+json_schema): valid answers, matcher ms per step.", rich_help_panel="Structured output")] = None,
    regex: Annotated[Optional[str], typer.Option("--regex", help="Also run every row under this regular expression (ROW+regex).", rich_help_panel="Structured output")] = None,
    grammar: Annotated[Optional[Path], typer.Option("--grammar", help="Also run every row under this Lark grammar file (ROW+grammar).", rich_help_panel="Structured output")] = None,
    model: Annotated[Optional[str], MODEL_FLAGS["model"][1]] = None,
    dtype: Annotated[Optional[str], MODEL_FLAGS["dtype"][1]] = None,
    device: Annotated[Optional[str], MODEL_FLAGS["device"][1]] = None,
    quantize: Annotated[Optional[str], MODEL_FLAGS["quantize"][1]] = None,
    device_map: Annotated[Optional[str], MODEL_FLAGS["device_map"][1]] = None,
    max_memory: Annotated[Optional[str], MODEL_FLAGS["max_memory"][1]] = None,
):
    """Benchmark decoding configurations (cache modes x commit rules) on a prompt set: tokens/s,
    NFE, speedup and agreement with the no-cache one-token-per-step baseline, memory, quality;
    with --quantize, also each row's agreement with itself on the unquantized weights."""
    if list_rows:
        return list_configs(model, suite)
    parallel.quiet_followers()
    from fastdllm.bench import cases as bench_cases
    from fastdllm.bench import prompts, runner
    from fastdllm.bench import rounds as bench_rounds
    from fastdllm.bench import suite as bench_suite
    from fastdllm.bench.format import FORMATS, format_for, require_matplotlib
    from fastdllm.bench.format import render as bench_render
    from fastdllm.bench.inputs import check_infilling
    from fastdllm.decode import profiles
    from fastdllm.decode.rules import RULES
    from fastdllm.eval.distributed import injected

    # everything a user can get wrong is checked before the model is loaded
    output, output_format = output_and_format(output, output_format, FORMATS)
    fmt = format_for(output_format, output)
    spec = spec_from(json_schema, regex, grammar)
    repetitions = bench_rounds.parse(repetitions)
    runner.check_counts(repetitions, warmup)
    placement = model_placement(dtype=dtype, device=device, quantize=quantize, device_map=device_map,
                                max_memory=max_memory)
    if tp not in (None, 1) and num_processes not in (None, 1):
        raise UsageError(f"--tp {tp} with --num-processes {num_processes}: one model split over processes, or one "
                         "whole model in each; give one or the other")
    if parallel.wanted(num_processes):                   # the processes check the rest; rank 0 speaks
        raise typer.Exit(parallel.launch(num_processes))
    world, ranks = parallel.split_over(tp, placement)    # tensor parallel: every rank runs every batch
    check_writable(output, "--output")
    check_writable(plot, "--plot")
    if plot is not None:
        require_matplotlib()
    model_dir = resolve_model_dir(model)
    table, left_out = bench_suite.suite_table(suite, model_dir) if suite else (None, [])
    defaults = bench_suite.SUITE_DEFAULTS.get(suite, {})
    if prompts_file is None and prompt_set is None:
        prompt_set = defaults.get("prompt_set")
    sweep = bench_cases.Sweep(gen_len=_comma_list(gen_len or defaults.get("gen_len", "256"), "gen_len"),
                         block_len=_comma_list(block_len, "block_len"), batch_size=_batch_sizes(batch_size),
                         threshold=_comma_list(threshold, "threshold"), factor=_comma_list(factor, "factor"),
                         early_stop=early_stop)
    rows = bench_cases.pick_rows(comma_names(configs), [profiles.find(p) for p in comma_names(profile) or []],
                                 table or bench_cases.table_for(model_dir))
    if prompts_file is not None and prompt_set is not None:
        raise UsageError("give --prompts FILE or --prompt-set NAME, not both")
    chosen = prompts.from_file(prompts_file) if prompts_file else prompts.builtin(prompt_set) if prompt_set else None
    n = n_prompts if n_prompts is not None or prompts_file else DEFAULT_N_PROMPTS
    chosen = chosen and chosen.take(n)
    if suite:                                            # a row the sweep refuses is left out, not an error
        cases, refused = bench_suite.expand_kept(rows, sweep, model_dir)
        left_out += refused
    else:
        cases = bench_cases.expand(rows, sweep, model_dir)
    if chosen is not None:
        check_infilling(chosen, cases, chat)
    if spec is not None:
        if chosen is not None and chosen.suffixes is not None:
            raise UsageError("structured output: not combined with infilling prompts (docs/specs/structured-output.md)")
        cases, refused = bench_cases.with_constraint(cases, spec.kind)
        left_out += refused
        if not any(c.constraint for c in cases):
            raise UsageError(f"structured output: no selected row can decode under a constraint ({refused[0]})")
    for param in bench_cases.SWEPT_PARAMS:
        if getattr(sweep, param) and not any(RULES[c.cfg.rule].param == param for c in cases):
            err_console.print(f"note: --{param} is ignored: no selected row uses it", style="yellow")

    world = world or parallel.join(num_processes, placement)
    lm = load_model(model_dir, ranks=ranks, **placement) if ranks else load_model(model_dir, **placement)
    constraint = compile_for(spec, lm)
    if chosen is None:
        chosen = prompts.builtin(prompts.default_set(model_dir, lm.has_chat_template and chat is not False)).take(n)
    if suite:                                            # and so is one the model refuses
        cases, refused = bench_suite.applicable(lm, cases, chosen, chat)
        left_out += refused
    for line in left_out:
        err_console.print(f"left out: {line}", style="yellow")
    if not cases:
        raise UsageError("no row of the suite applies to this model and sweep")
    render = functools.partial(bench_render, left_out=left_out)

    measured, stopped = [], None
    share = (0, 1) if ranks else (world.rank, world.size)  # data parallel: this rank's share of the batches
    quantized = placement["quantize"] != "none"
    total = runner.count_runs(cases, len(chosen.prompts), repetitions, warmup, share) + (
        runner.count_runs(cases, len(chosen.prompts), 1, 0, share) if quantized else 0)
    err_console.print(f"bench: {plural(len(cases), 'row')} x {plural(len(chosen.prompts), chosen.name + ' prompt')} "
                      f"({plural(total, 'run')}{f' on rank 0 of {world.size}' if share[1] > 1 else ''}) on {lm.path.name}"
                      + (f", split over {tp} tensor-parallel ranks" if ranks else ""),
                      style="dim")
    try:
        with RunProgress(total, len(chosen.prompts), warmup, share) as tick:
            parts = runner.measure_share(lm, cases, chosen, chat=chat, repetitions=repetitions, warmup=warmup,
                                         on_run=tick, share=share, constraint=constraint)
            for case in cases:                           # in step: every rank's share of a row, then the next
                shares = [next(parts)] if ranks else world.exchange(lambda: (injected(world, case.name), next(parts))[1])
                if not world.first:
                    continue
                m = runner.merge(shares)
                m.record["tensor_parallel"] = tp if ranks else None
                measured.append(m)
                if output is not None:                   # on disk as soon as it is finished
                    save(runner.compare(measured), fmt, output, render)
            if quantized:                                # timed rows first: their memory is the quantized model's
                parts.close()
                del lm, parts
                for m, answers in zip(measured, _unquantized_answers(model_dir, placement, cases, chosen, chat,
                                                                     world, tick, spec)):
                    m.unquantized = answers
                if output is not None:
                    save(runner.compare(measured), fmt, output, render)
    except (KeyboardInterrupt, Exception) as e:          # Ctrl+C, out of memory, ...: keep the finished rows
        # (repetitions interleave: a row is finished once it runs no more rounds)
        stopped = e
        if measured:
            what = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
            err_console.print(f"{what}: keeping the {len(measured)} of {plural(len(cases), 'row')} finished", style="yellow")
    records = runner.compare(measured)
    if records:
        _emit(records, fmt, output, plot, left_out)
    if isinstance(stopped, KeyboardInterrupt):
        raise typer.Exit(130)
    if stopped is not None:
        raise stopped


def _unquantized_answers(model_dir, placement: dict, cases, chosen, chat, world, tick, spec) -> list[list[list[int]]]:
    """Every case run once (untimed) on the model loaded unquantized, same dtype and device: the
    answers that each quantized row is compared with (rank 0's list; the others' is empty)."""
    import gc

    import torch

    from fastdllm.bench import runner

    gc.collect()                                         # the quantized model goes first
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    lm = load_model(model_dir, **{**placement, "quantize": "none"})
    parts = runner.measure_share(lm, cases, chosen, chat=chat, repetitions=1, warmup=0, on_run=tick,
                                 share=(world.rank, world.size), constraint=compile_for(spec, lm))
    answers = []
    for _ in cases:
        shares = world.exchange(lambda: next(parts))
        if world.first:
            answers.append(runner.merge(shares).answers)
    return answers


def _emit(records: list[dict], fmt: str, output: Path | None, plot: Path | None, left_out: list[str]) -> None:
    from fastdllm.bench.format import plot as draw
    from fastdllm.bench.format import render, table

    if output is not None:
        save(records, fmt, output, functools.partial(render, left_out=left_out))
        err_console.print(f"results written to {output} ({fmt})", style="dim")
    if output is None and fmt != "table":
        sys.stdout.write(render(records, fmt, left_out=left_out))
    elif is_terminal(sys.stdout):
        out_console.print(table(records, left_out))
    else:
        sys.stdout.write(render(records, "table", left_out=left_out))
    if plot is not None:
        draw(records, plot)
        err_console.print(f"plot written to {plot}", style="dim")
