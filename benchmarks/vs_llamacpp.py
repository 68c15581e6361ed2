#!/usr/bin/env python3
"""fastdllm beside llama.cpp's diffusion CLI on the same random Dream-format checkpoint (a benchmark).

    python benchmarks/vs_llamacpp.py --shapes 22m                      # token equality and timings
    python benchmarks/vs_llamacpp.py --shapes 0.5b --eq-steps 32 --e2e project --reps 2
    python benchmarks/vs_llamacpp.py --shapes 22m --busy --json /tmp/vs.json
    python benchmarks/vs_llamacpp.py --gguf FILE [--gguf FILE2 ...]    # one's own Dream/LLaDA GGUF files:
                                                    # vs_llamacpp_gguf.py (both engines read the same file)

benchmarks/llamacpp_build.py builds llama.cpp (the llama-cpp-python sdist's vendored copy) and converts
the checkpoint with llama.cpp's own tools, once, into a cache outside the repository. Peak RSS: each
llama.cpp run's; fastdllm's from one more run per row in a process of its own (llamacpp_runs.py).

Which llama.cpp setting is which fastdllm rule (greedy is `--top-k 1`, leftmost first: fastdllm's
`sequential`; the block count; `-fa off` for equality): docs/reports/vs-llamacpp.md.
llama.cpp runs through llama-diffusion-ids, diffusion-cli.cpp with prompt ids in and canvas ids out
(llamacpp_build.py); it is checked once against the unmodified llama-diffusion-cli (same text).
"""

from __future__ import annotations

# fastdllm's runs in this process follow the free cores as its CLI's do (fastdllm/thread_watch.py);
# llama.cpp (OpenMP too) runs with the environment as the user has it.
import os

USER_ENV = dict(os.environ)

import json
import subprocess
import sys
from pathlib import Path

import harness
import llamacpp_build as lb  # benchmarks/llamacpp_build.py
import llamacpp_runs
import torch
from llamacpp_runs import cfg_of, fastdllm, fastdllm_peaks, llama, load_fastdllm, loadavg, summary, timed

from fastdllm import thread_watch
from fastdllm.models.cpu import bf16_note, capability

PRECISIONS = [("f32", "fp32"), ("bf16", "bf16"), ("q8_0", "int8"), ("q4_0", "int4")]   # llama.cpp, fastdllm
mb = lambda n: "-" if n is None else f"{n / 2 ** 20:.0f} MiB"            # noqa: E731  a peak RSS
TEXT = ("Write a short story about a robot who learns to paint. The robot lives in a small town by the sea, "
        "and every morning it walks to the harbour to watch the fishing boats come in. One day it finds a box "
        "of old paints left behind by a sailor, and it begins to wonder what colours the sea would be if it "
        "could paint them itself.")


def equality(bins, files, lms, prompt, a, steps: int) -> dict:
    """fp32: llama.cpp greedy (-fa off) against fastdllm's sequential rule, uncached."""
    L = llama(bins, files["f32"], prompt, a, steps=steps * (len(prompt) + a.gen_len) // a.gen_len, fa="off")
    F = fastdllm(lms["fp32"], prompt, cfg_of(a, "sequential", "none", steps))
    diff = next((i for i, (x, y) in enumerate(zip(L["ids"], F["ids"])) if x != y), None)
    out = {"equal": L["ids"] == F["ids"], "first_difference": diff, "n": len(F["ids"]), "steps": steps,
           "llama_prompt_ids_equal": L["prompt_ids"] == prompt, "llama_forwards": L["forwards"],
           "fastdllm_forwards": F["forwards"]}
    if diff is not None:
        out["at_difference"] = {"llama": L["ids"][diff], "fastdllm": F["ids"][diff]}
        out["same_after_difference"] = sum(x == y for x, y in zip(L["ids"][diff:], F["ids"][diff:]))
    return out


def shape_rows(bins, files, lms, prompt, a, shape: str) -> tuple[list[dict], list[str]]:
    canvas, notes = len(prompt) + a.gen_len, []
    blocks = canvas // a.block_len
    rows = []

    def add(tool, setting, precision, run, kind, cfg=None):
        rows.append({"shape": shape, "tool": tool, "setting": setting, "precision": precision, "run": run,
                     "kind": kind, "canvas": canvas, **({"cfg": cfg} if cfg else {})})

    def add_fastdllm(setting, fq, cfg, kind):           # its cfg kept for its peak RSS (fastdllm_peaks)
        add("fastdllm", setting, fq, lambda: fastdllm(lms[fq], prompt, cfg), kind, cfg)

    per_block = a.fwd_steps // (a.gen_len // a.block_len)            # fastdllm steps per block
    for lq, fq in PRECISIONS:
        if lq in a.precisions:
            add("llama.cpp", f"block {a.block_len}, {per_block}/block, uncached", lq,
                lambda lq=lq: llama(bins, files[lq], prompt, a, steps=per_block * blocks), "forward")
        if fq in lms:
            add_fastdllm(f"sequential, {per_block}/block, cache none", fq, cfg_of(a, "sequential", "none", a.fwd_steps),
                         "forward")
    # end to end, one token per step: llama.cpp's two schedules at every precision it has here
    if a.e2e == "measure":
        for lq, _ in PRECISIONS:
            if lq in a.best_llama:
                add("llama.cpp", f"block {a.block_len}, 1 token/step", lq,
                    lambda lq=lq: llama(bins, files[lq], prompt, a, steps=a.block_len * blocks), "e2e")
                add("llama.cpp", f"timestep eps {a.eps:g}, {a.gen_len} steps", lq,
                    lambda lq=lq: llama(bins, files[lq], prompt, a, steps=a.gen_len, eps=a.eps), "e2e")
    for _, fq in PRECISIONS:
        if fq in lms and fq in a.best_fastdllm:
            if a.uncached_e2e:
                add_fastdllm("sequential, 1 token/step, cache none", fq, cfg_of(a, "sequential", "none"), "e2e")
            add_fastdllm(f"threshold {a.threshold:g}, DualCache", fq, cfg_of(a, "threshold", "dual"), "e2e")
    return rows, notes


def project_llama_e2e(results: list[dict], a, blocks: int) -> list[dict]:
    """--e2e project: llama.cpp's one-token-per-step run from its measured per forward (every
    llama.cpp forward is the same full-canvas pass; the block schedule adds blocks - gen/block empty
    blocks of one forward each)."""
    out = []
    forwards = a.gen_len + blocks - a.gen_len // a.block_len
    for r in results:
        if r["tool"] == "llama.cpp" and r["kind"] == "forward":
            q = r["quiet"]
            secs = q["ms_per_forward"] * forwards / 1000
            keep = ("shape", "tool", "precision", "canvas", "peak_rss_bytes")
            out.append({**{k: r[k] for k in keep if k in r}, "kind": "e2e",
                        "setting": f"block {a.block_len}, 1 token/step (projected: {forwards} x per forward)",
                        "quiet": {"ms_per_forward": q["ms_per_forward"], "ms_per_forward_spread": "-",
                                  "tokens_per_s": a.gen_len / secs, "tokens_per_s_spread": "-",
                                  "forwards": forwards, "projected": True}})
    return out


# -- table -------------------------------------------------------------------------------------------

def table(results: list[dict], busy: bool) -> str:
    head = ("| shape | tool | setting | precision | canvas | forwards | ms / forward (spread) | tokens/s (spread) "
            "| peak RSS |")
    head += " busy slowdown |" if busy else ""
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        q = r["quiet"]
        line = (f"| {r['shape']} | {r['tool']} | {r['setting']} | {r['precision']} | {r['canvas']} | {q['forwards']} | "
                f"{q['ms_per_forward']:.2f} ({q['ms_per_forward_spread']}) | {q['tokens_per_s']:.1f} "
                f"({q['tokens_per_s_spread']}) | {mb(r.get('peak_rss_bytes'))} |")
        if busy:
            line += f" {r['busy_slowdown']:.2f}x |" if "busy_slowdown" in r else " - |"
        lines.append(line)
    return "\n".join(lines)


def best_lines(results: list[dict]) -> list[str]:
    out = []
    for shape in dict.fromkeys(r["shape"] for r in results):
        e2e = [r for r in results if r["shape"] == shape and r["kind"] == "e2e"]
        best = {}
        for tool in ("llama.cpp", "fastdllm"):
            mine = [r for r in e2e if r["tool"] == tool]
            if mine:
                best[tool] = max(mine, key=lambda r: r["quiet"]["tokens_per_s"])
        if len(best) == 2:
            L, F = best["llama.cpp"], best["fastdllm"]
            out.append(f"{shape}: best end to end: fastdllm {F['precision']} {F['setting']} "
                       f"{F['quiet']['tokens_per_s']:.1f} tok/s vs llama.cpp {L['precision']} {L['setting']} "
                       f"{L['quiet']['tokens_per_s']:.2f} tok/s: {F['quiet']['tokens_per_s'] / L['quiet']['tokens_per_s']:.1f}x"
                       f"; peak RSS {mb(F.get('peak_rss_bytes'))} vs {mb(L.get('peak_rss_bytes'))}")
        fwd = {(r["tool"], r["precision"]): r["quiet"]["ms_per_forward"]
               for r in results if r["shape"] == shape and r["kind"] == "forward"}
        for lq, fq in PRECISIONS:
            if ("llama.cpp", lq) in fwd and ("fastdllm", fq) in fwd:
                ratio = fwd[("llama.cpp", lq)] / fwd[("fastdllm", fq)]
                out.append(f"{shape}: per forward {fq} vs {lq}: fastdllm {fwd[('fastdllm', fq)]:.2f} ms, llama.cpp "
                           f"{fwd[('llama.cpp', lq)]:.2f} ms: fastdllm {'faster' if ratio >= 1 else 'slower'} "
                           f"({ratio:.2f}x llama.cpp's speed)")
    return out


def versions(info: dict) -> dict:
    import transformers

    root = Path(__file__).resolve().parent.parent
    git = lambda *c: subprocess.run(["git", "-C", root, *c], capture_output=True, text=True).stdout.strip()  # noqa: E731
    gcc = subprocess.run(["gcc", "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    return {"fastdllm_commit": git("rev-parse", "--short=12", "HEAD"),
            "fastdllm_tree_dirty": bool(git("status", "--porcelain", "--untracked-files=no", "fastdllm")),
            "torch": torch.__version__, "transformers": transformers.__version__, "gcc": gcc, **info}


def main() -> None:
    if any(arg.split("=")[0] == "--gguf" for arg in sys.argv[1:]):       # GGUF files one has: their own flow
        return __import__("vs_llamacpp_gguf").main(USER_ENV)
    ap = harness.parser(__doc__, reps=3)
    ap.set_defaults(threads=2)                                   # both tools
    ap.add_argument("--shapes", default="22m", help=f"comma list of {', '.join(lb.SHAPES)}")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--block-len", type=int, default=32)
    ap.add_argument("--eq-steps", type=int, default=None, help="fastdllm steps of the equality run (default gen_len: "
                    "one token per step; fewer: gen_len/steps tokens per step, leftmost first, in both)")
    ap.add_argument("--fwd-steps", type=int, default=8, help="fastdllm steps of the per-forward rows (llama.cpp: the "
                    "same steps per block over its ub/block blocks)")
    ap.add_argument("--precisions", default="f32,bf16,q8_0,q4_0", help="llama.cpp types (fastdllm: the matching class)")
    ap.add_argument("--best-llama", default="f32,bf16,q8_0,q4_0", help="llama.cpp types timed end to end")
    ap.add_argument("--best-fastdllm", default="fp32,bf16,int8,int4", help="fastdllm precisions timed end to end")
    ap.add_argument("--e2e", choices=("measure", "project"), default="measure",
                    help="llama.cpp end to end: run it, or project it from its per-forward rows (0.5B on 2 cores)")
    ap.add_argument("--uncached-e2e", action="store_true", help="also time fastdllm's uncached one-token-per-step run")
    ap.add_argument("--eps", type=float, default=1e-3, help="llama.cpp timestep schedule's eps")
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--busy", action="store_true", help="also time every row beside a hog on one core")
    ap.add_argument("--busy-core", type=int, default=0)
    ap.add_argument("--no-cli-check", action="store_true", help="skip the run of the unmodified llama-diffusion-cli")
    ap.add_argument("--llamacpp-version", help="llama-cpp-python sdist version (default: the newest)")
    a = harness.parse(ap)
    llamacpp_runs.LLAMA_ENV = USER_ENV
    a.precisions, a.best_llama, a.best_fastdllm = ([p for p in s.split(",") if p != "none"]
                                                 for s in (a.precisions, a.best_llama, a.best_fastdllm))
    for flag, given, known in (("--precisions", a.precisions, [p[0] for p in PRECISIONS]),
                               ("--best-llama", a.best_llama, [p[0] for p in PRECISIONS]),
                               ("--best-fastdllm", a.best_fastdllm, [p[1] for p in PRECISIONS])):
        if unknown := [p for p in given if p not in known]:
            ap.error(f"{flag} {','.join(unknown)}: expected some of {','.join(known)} (or none)")
    thread_watch.start(a.threads, set(os.sched_getaffinity(0)))     # as the CLI: fewer beside busy cores
    shapes = a.shapes.split(",")
    kinds = sorted(set(a.precisions) | set(a.best_llama) | {"f32"}, key=[p[0] for p in PRECISIONS].index)
    prep = lb.prepare(shapes, kinds=kinds, version=a.llamacpp_version, jobs=os.cpu_count())
    conditions = {"cpu": harness.cpu_name(), "torch_capability": capability(), "bf16": bf16_note(), "threads": a.threads,
                  "cores": os.cpu_count(), "load_start": loadavg(), "reps": a.reps, "prompt_len": a.prompt_len,
                  "gen_len": a.gen_len, "block_len": a.block_len, **versions(prep["info"])}
    print(f"built llama.cpp {prep['info']} in {lb.CACHE}", file=sys.stderr)
    results, report = [], {"conditions": conditions, "shapes": {}, "notes": []}
    for shape in shapes:
        files = prep["files"][shape]
        lms, skipped = {}, {}
        for _, fq in PRECISIONS:
            lm, why = load_fastdllm(files["checkpoint"], fq)
            (lms.__setitem__(fq, lm) if lm else skipped.__setitem__(fq, why))
        for fq, why in skipped.items():
            note = f"{shape}: fastdllm {fq} skipped: load(..., quantize={fq!r}) fails here: {why}"
            report["notes"].append(note)
            print(note, file=sys.stderr)
        tok = lms["fp32"].tokenizer
        prompt = tok(TEXT)["input_ids"][:a.prompt_len]
        n_params = sum(p.numel() for p in lms["fp32"].model.parameters())
        info = {"description": lb.SHAPES[shape].text, "params": n_params, "canvas": a.prompt_len + a.gen_len}
        # warm-up (fastdllm: the first forward of a process; llama.cpp: page cache)
        for fq, lm in lms.items():
            fastdllm(lm, prompt, cfg_of(a, "sequential", "none", a.gen_len // a.block_len))
        if not a.no_cli_check:
            text = tok.decode(prompt)
            plain = llama(prep["bins"], files["f32"], prompt, a, steps=(a.prompt_len + a.gen_len) // a.block_len,
                          text=text, plain=True)
            patched = llama(prep["bins"], files["f32"], prompt, a, steps=(a.prompt_len + a.gen_len) // a.block_len,
                            text=text)
            info["cli_check"] = {"same_text": plain["text"] == patched["text"], "cli_s": plain["seconds"],
                                 "ids_driver_s": patched["seconds"], "forwards": [plain["forwards"], patched["forwards"]]}
            print(f"{shape}: CLI check {info['cli_check']}", file=sys.stderr)
        eq = equality(prep["bins"], files, lms, prompt, a, a.eq_steps or a.gen_len)
        info["equality"] = eq
        print(f"{shape}: equality {eq}", file=sys.stderr, flush=True)
        rows, notes = shape_rows(prep["bins"], files, lms, prompt, a, shape)
        timed(rows, a.reps, a.busy_core if a.busy else None)
        fastdllm_peaks(rows, files["checkpoint"], prompt, a.threads)
        shape_results = [summary(r, a.gen_len) for r in rows]
        if a.e2e == "project":
            shape_results += project_llama_e2e(shape_results, a, (a.prompt_len + a.gen_len) // a.block_len)
        results += shape_results
        report["shapes"][shape] = info
        report["notes"] += notes
        del lms
    conditions["load_end"] = loadavg()
    c = conditions
    print(f"\n# fastdllm vs llama.cpp's diffusion CLI\n\n"
          f"CPU {c['cpu']} ({c['cores']} cores), torch capability {c['torch_capability']}, {c['bf16']}; "
          f"{c['threads']} threads each; load {c['load_start']} -> {c['load_end']}; fastdllm {c['fastdllm_commit']}"
          f"{' (uncommitted changes in fastdllm/)' if c['fastdllm_tree_dirty'] else ''}, torch {c['torch']}, "
          f"transformers {c['transformers']}; llama.cpp {c['llama_cpp_commit']} ({c.get('llama_cpp_date', '?')}, "
          f"llama-cpp-python {c['llama_cpp_python']} sdist, ggml {c.get('ggml', '?')}, gcc {c['gcc']}, -march=native).\n"
          f"Prompt {c['prompt_len']} tokens, {c['gen_len']} generated, blocks of {c['block_len']}, greedy; medians of "
          f"{c['reps']} interleaved runs (spread min-max).\n")
    for shape, info in report["shapes"].items():
        eq = info["equality"]
        print(f"- {shape}: {info['description']}, {info['params'] / 1e6:.1f}M parameters, canvas {info['canvas']}. "
              f"Token equality (fp32, llama.cpp -fa off --top-k 1 vs fastdllm sequential, cache none, "
              f"{eq['n'] // eq['steps']} token(s)/step): {'EQUAL' if eq['equal'] else 'DIFFERENT'} over {eq['n']} "
              f"tokens" + ("" if eq["equal"] else f", first difference at {eq['first_difference']} "
                           f"{eq['at_difference']}") + (f"; plain CLI vs ids driver same text: "
                                                        f"{info['cli_check']['same_text']}" if "cli_check" in info else ""))
    print()
    print(table(results, a.busy))
    print()
    for line in best_lines(results) + report["notes"]:
        print(f"- {line}")
    if a.json:
        report["results"] = results
        a.json.write_text(json.dumps(report, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
