#!/usr/bin/env python3
"""fastdllm beside llama.cpp's diffusion CLI on GGUF files one has (Dream or LLaDA, as llama.cpp names
them): both engines read the SAME file (a benchmark).

    python benchmarks/vs_llamacpp.py --gguf dream-f32.gguf --gguf dream-Q4_K_M.gguf   # dispatches here
    python benchmarks/vs_llamacpp_gguf.py --gguf FILE [--gguf FILE2 ...] --gen-len 128 --reps 2

llama.cpp is built once by llamacpp_build.py (no conversion: the files are the user's) and runs
through llama-diffusion-ids; fastdllm opens each file as `fastdllm generate -m FILE.gguf` does (the
folder standing for it, fastdllm/checkpoints/gguf_folder.py). Per file:

- token equality, F32 files only: llama.cpp greedy one token a step (--top-k 1 --temp 0 -fa off)
  against fastdllm fp32 loaded from the file, sequential rule, no cache (vs_llamacpp.equality; why
  sequential is llama.cpp's greedy: vs_llamacpp.py's docstring);
- per forward, like for like: both uncached, the same steps per block (the whole canvas a forward);
- each at its best, end to end: llama.cpp blocks of 32, one token a step, against fastdllm DualCache
  + threshold 0.9, at the precision the file's weights map to (F32 fp32, F16/BF16 bf16, Q8_0
  --quantize int8 straight from the file, Q4_0/Q4_K(_M) int4: what a 4-bit file gets on a CPU by
  default); --fastdllm-precision overrides it.
Peak RSS, every row: llama.cpp's runs' own; fastdllm's from one more run of the row's setting in a
process of its own (llamacpp_runs).
Threads: the same fixed --threads for both (no thread watch: fastdllm does not give way to a busy
core here, so both sides see the same load).

A file of its own, which vs_llamacpp.py's --gguf dispatches to: vs_llamacpp.py's flow (random
checkpoints it writes and converts, every precision from one checkpoint) is another, and that file is
at the benchmarks' 310-line limit; this one reuses its equality() and table() and llamacpp_runs.py's runs.
"""

from __future__ import annotations

import os

USER_ENV = dict(os.environ)     # llama.cpp runs with the environment as the user has it

import json
import sys
from pathlib import Path

import harness
import llamacpp_build as lb
import llamacpp_runs
import vs_llamacpp as vs
from llamacpp_runs import cfg_of, fastdllm, fastdllm_peaks, llama, load_fastdllm, loadavg, summary, timed

from fastdllm.checkpoints.gguf_file import FOUR_BIT
from fastdllm.checkpoints.gguf_folder import folder_for, source_of
from fastdllm.models.cpu import bf16_note, capability

ARCHITECTURES = ("dream", "llada")          # llama.cpp's names of the diffusion models its CLI runs here
FASTDLLM_PRECISIONS = ("fp32", "bf16", "int8", "int4")


def precision_of(types: list[str]) -> str:
    """fastdllm's precision for a file holding tensors of `types` (most elements first, as
    gguf_file.summary lists them): int4 for any 4-bit type, int8 for Q8_0, bf16 for 16-bit floats, fp32."""
    if any(t in FOUR_BIT for t in types):
        return "int4"
    if "Q8_0" in types:
        return "int8"
    return "bf16" if types and types[0] in ("BF16", "F16") else "fp32"


def llama_label(types: list[str]) -> str:
    """The file's types as a precision column: its 2-D types, e.g. q4_k+q6_k (f32 alone: f32)."""
    return "+".join(t.lower() for t in types if t != "F32") or "f32"


def file_rows(bins, path: Path, lm, prompt: list[int], lq: str, fq: str, a) -> list[dict]:
    canvas = len(prompt) + a.gen_len
    blocks, per_block = canvas // a.block_len, a.fwd_steps // (a.gen_len // a.block_len)
    rows = []

    def add(tool, setting, precision, run, kind, cfg=None):
        rows.append({"shape": path.name, "tool": tool, "setting": setting, "precision": precision, "run": run,
                     "kind": kind, "canvas": canvas, **({"cfg": cfg} if cfg else {})})

    fwd_cfg, best_cfg = cfg_of(a, "sequential", "none", a.fwd_steps), cfg_of(a, "threshold", "dual")
    add("llama.cpp", f"block {a.block_len}, {per_block}/block, uncached", lq,
        lambda: llama(bins, path, prompt, a, steps=per_block * blocks), "forward")
    add("fastdllm", f"sequential, {per_block}/block, cache none", fq, lambda: fastdllm(lm, prompt, fwd_cfg), "forward",
        fwd_cfg)                                     # a cfg: this row's peak RSS is measured too (fastdllm_peaks)
    add("llama.cpp", f"block {a.block_len}, 1 token/step", lq,
        lambda: llama(bins, path, prompt, a, steps=a.block_len * blocks), "e2e")
    add("fastdllm", f"threshold {a.threshold:g}, DualCache", fq, lambda: fastdllm(lm, prompt, best_cfg), "e2e", best_cfg)
    return rows


def ratio_lines(results: list[dict]) -> list[str]:
    """Per file: the best end to end of each (tokens/s, ms per forward, peak RSS) and the like-for-like
    per-forward ratio."""
    out = []
    for name in dict.fromkeys(r["shape"] for r in results):
        rows = {(r["tool"], r["kind"]): r for r in results if r["shape"] == name}
        if ("llama.cpp", "e2e") in rows and ("fastdllm", "e2e") in rows:
            L, F = rows["llama.cpp", "e2e"], rows["fastdllm", "e2e"]
            lq, fq = L["quiet"], F["quiet"]
            out.append(f"{name}: best end to end: fastdllm {F['precision']} {F['setting']} {fq['tokens_per_s']:.1f} "
                       f"tok/s ({fq['forwards']} forwards, {fq['ms_per_forward']:.2f} ms each) vs llama.cpp "
                       f"{L['setting']} {lq['tokens_per_s']:.2f} tok/s ({lq['forwards']} forwards, "
                       f"{lq['ms_per_forward']:.2f} ms each): {fq['tokens_per_s'] / lq['tokens_per_s']:.1f}x tokens/s, "
                       f"per forward llama.cpp / fastdllm {lq['ms_per_forward'] / fq['ms_per_forward']:.2f}x; "
                       f"peak RSS fastdllm {vs.mb(F.get('peak_rss_bytes'))} vs llama.cpp {vs.mb(L.get('peak_rss_bytes'))}")
        if ("llama.cpp", "forward") in rows and ("fastdllm", "forward") in rows:
            lf, ff = rows["llama.cpp", "forward"]["quiet"], rows["fastdllm", "forward"]["quiet"]
            ratio = lf["ms_per_forward"] / ff["ms_per_forward"]
            out.append(f"{name}: per forward, both uncached: fastdllm {ff['ms_per_forward']:.2f} ms, llama.cpp "
                       f"{lf['ms_per_forward']:.2f} ms: fastdllm {'faster' if ratio >= 1 else 'slower'} "
                       f"({ratio:.2f}x llama.cpp's speed)")
    return out


def one_file(bins, path: Path, a, report: dict) -> list[dict]:
    """Equality (F32 files) and the timed rows of one GGUF file; a file fastdllm or this benchmark
    cannot take is a note in the report, said as the loader said it."""
    name = path.name
    try:
        folder = folder_for(path)
    except Exception as e:                                      # noqa: BLE001 (said in the report)
        report["notes"].append(f"{name}: fastdllm cannot open it: {type(e).__name__}: {str(e).splitlines()[0]}")
        return []
    src = source_of(folder)
    types, arch = src["types"], src["architecture"]
    if arch not in ARCHITECTURES:
        report["notes"].append(f"{name}: architecture {arch!r}: llama.cpp's diffusion CLI runs {', '.join(ARCHITECTURES)}")
        return []
    lq, fq = llama_label(types), a.fastdllm_precision or precision_of(types)
    lm, why = load_fastdllm(folder, fq)
    if lm is None:
        report["notes"].append(f"{name}: fastdllm {fq} skipped: load(..., {fq}) fails: {why}")
        return []
    tok = lm.tokenizer
    prompt = tok(" ".join([vs.TEXT] * 4))["input_ids"][:a.prompt_len]
    info = {"architecture": arch, "types": types, "bytes_on_disk": src["bytes_on_disk"], "fastdllm": fq,
            "fastdllm_load": {k: v for k, v in lm.info.items() if k.startswith("gguf")} | {"notes": lm.notes},
            "params": lm.model.parameters_before_quantization, "canvas": len(prompt) + a.gen_len}
    fastdllm(lm, prompt, cfg_of(a, "sequential", "none", a.gen_len // a.block_len))        # warm-up
    if set(types) == {"F32"} and not a.no_equality:
        eq_lm = lm if fq == "fp32" else load_fastdllm(folder, "fp32")[0]
        info["equality"] = vs.equality(bins, {"f32": path}, {"fp32": eq_lm}, prompt, a, a.eq_steps or a.gen_len)
        print(f"{name}: equality {info['equality']}", file=sys.stderr, flush=True)
        del eq_lm
    rows = file_rows(bins, path, lm, prompt, lq, fq, a)
    timed(rows, a.reps, None)
    for row in rows:                 # the model freed before fastdllm's memory run (a process of its own)
        row.pop("run")
    del lm
    fastdllm_peaks(rows, folder, prompt, a.threads)
    report["files"][name] = info
    return [summary(r, a.gen_len) for r in rows]


def describe_file(name: str, info: dict) -> str:
    line = (f"- {name}: {info['architecture']}, {info['params'] / 1e6:.1f}M parameters, {', '.join(info['types'])} "
            f"({info['bytes_on_disk'] / 2 ** 20:.0f} MiB of tensors), canvas {info['canvas']}; fastdllm {info['fastdllm']}")
    kept = [v for k, v in info["fastdllm_load"].items() if k.startswith("gguf_")]
    line += f" ({kept[0]})" if kept else ""
    if eq := info.get("equality"):
        line += (f". Token equality (llama.cpp -fa off --top-k 1 vs fastdllm fp32 from the file, sequential, cache none, "
                 f"{eq['n'] // eq['steps']} token(s)/step): {'EQUAL' if eq['equal'] else 'DIFFERENT'} over {eq['n']} "
                 f"tokens" + ("" if eq["equal"] else f", first difference at {eq['first_difference']} "
                              f"{eq['at_difference']}"))
    return line


def main(user_env: dict | None = None) -> None:
    ap = harness.parser(__doc__, reps=3)
    ap.set_defaults(threads=2)                                   # both tools
    ap.add_argument("--gguf", type=Path, action="append", required=True, metavar="FILE",
                    help="a Dream or LLaDA GGUF file (repeat for more)")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--block-len", type=int, default=32)
    ap.add_argument("--eq-steps", type=int, default=None, help="fastdllm steps of the equality run (default gen_len)")
    ap.add_argument("--no-equality", action="store_true", help="skip the equality run of F32 files")
    ap.add_argument("--fwd-steps", type=int, default=8, help="steps of the like-for-like per-forward rows")
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--fastdllm-precision", choices=FASTDLLM_PRECISIONS,
                    help="fastdllm's precision for every file (default: the file's, precision_of)")
    ap.add_argument("--llamacpp-version", help="llama-cpp-python sdist version (default: the newest)")
    a = harness.parse(ap)
    llamacpp_runs.LLAMA_ENV = user_env or USER_ENV
    if missing := [str(p) for p in a.gguf if not p.is_file()]:
        ap.error(f"--gguf: no such file: {', '.join(missing)}")
    src = lb.source(a.llamacpp_version)
    bins = lb.build(src, os.cpu_count())
    conditions = {"cpu": harness.cpu_name(), "torch_capability": capability(), "bf16": bf16_note(), "threads": a.threads,
                  "cores": os.cpu_count(), "load_start": loadavg(), "reps": a.reps, "prompt_len": a.prompt_len,
                  "gen_len": a.gen_len, "block_len": a.block_len, **vs.versions(lb.describe(src))}
    report, results = {"conditions": conditions, "files": {}, "notes": []}, []
    for path in a.gguf:
        results += one_file(bins, path.resolve(), a, report)
    conditions["load_end"] = loadavg()
    c = conditions
    print(f"\n# fastdllm vs llama.cpp's diffusion CLI, on the same GGUF files\n\n"
          f"CPU {c['cpu']} ({c['cores']} cores), torch capability {c['torch_capability']}, {c['bf16']}; "
          f"{c['threads']} threads each; load {c['load_start']} -> {c['load_end']}; fastdllm {c['fastdllm_commit']}"
          f"{' (uncommitted changes in fastdllm/)' if c['fastdllm_tree_dirty'] else ''}, torch {c['torch']}; "
          f"llama.cpp {c['llama_cpp_commit']} (llama-cpp-python {c['llama_cpp_python']} sdist, ggml {c.get('ggml', '?')}, "
          f"gcc {c['gcc']}, -march=native).\nPrompt {c['prompt_len']} tokens, {c['gen_len']} generated, blocks of "
          f"{c['block_len']}, greedy; medians of {c['reps']} interleaved runs (spread min-max).\n")
    for name, info in report["files"].items():
        print(describe_file(name, info))
    print()
    print(vs.table(results, False))
    print()
    for line in ratio_lines(results) + report["notes"]:
        print(f"- {line}")
    if a.json:
        a.json.write_text(json.dumps({**report, "results": results}, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
