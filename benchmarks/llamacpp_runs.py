"""The runs benchmarks/vs_llamacpp.py times: one llama.cpp diffusion run (llama-diffusion-ids or the
plain llama-diffusion-cli), one fastdllm run, a CPU hog for --busy, the interleaved repetitions and
their medians and spreads; each engine's peak memory (the peak RSS of a process that loads the model
and decodes once: llama.cpp's run itself, and for fastdllm a fresh process of its own, since the
timed runs share one process with every precision's model loaded)."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import loadavg, span

from fastdllm.checkpoints import loading
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import stepper


# -- llama.cpp --------------------------------------------------------------------------------------

LLAMA_ENV: dict | None = None     # the environment llama.cpp runs with (None: this process's)


def llama(bins, gguf: Path, prompt: list[int], a, *, steps: int, eps: float | None = None, fa: str = "auto",
          text: str | None = None, plain: bool = False) -> dict:
    """One llama.cpp run: llama-diffusion-ids with the prompt as ids (or as `text`, templated and
    tokenized as the CLI does), or the unmodified llama-diffusion-cli (`plain`, with `text`)."""
    canvas = len(prompt) + a.gen_len
    cmd = [bins["llama-diffusion-cli" if plain else "llama-diffusion-ids"], "-m", gguf,
           "-p", text or "ids:" + ",".join(map(str, prompt)), "-ub", canvas, "-b", canvas, "-c", canvas,
           "--diffusion-steps", steps, "--diffusion-algorithm", 4, "--top-k", 1, "--temp", 0, "--seed", 0,
           "-t", a.threads, "-tb", a.threads, "-fa", fa, "--load-mode", "none"]
    cmd += ["--diffusion-eps", eps] if eps else ["--diffusion-block-length", a.block_len]
    p = measured(list(map(str, cmd)), env=LLAMA_ENV)
    log = p.stdout + p.stderr
    m = re.search(r"total time: ([\d.]+)ms, time per step: ([\d.]+)ms, sampling time per step: ([\d.]+)ms", log)
    # the driver's own clock of diffusion_generate, where the log's last line did not come out (a LLaDA file's
    # run can end before the log thread writes it)
    us = re.search(r"(?m)^generate_us: (\d+)$", p.stdout)
    if p.returncode or not (m or us):
        raise SystemExit(f"llama.cpp failed ({p.returncode}): {' '.join(map(str, cmd))}\n{log[-3000:]}")
    out = {"seconds": float(m[1]) / 1000 if m else int(us[1]) / 1e6, "peak_rss_bytes": p.peak_rss_bytes,
           "forwards": log.count("diffusion step:"),          # its progress line: one per forward
           "text": re.sub(r"(?m)^\d+(\.\d+)+ [IWED] ", "", log[m.end():]).strip() if m else ""}   # less the time stamps
    if m:
        out["sampling_s"] = float(m[3]) * steps / 1000
    ids = dict(line.split(":", 1) for line in p.stdout.splitlines() if line.endswith(tuple("0123456789")) and ":" in line)
    if "canvas_ids" in ids:
        out["ids"] = [int(t) for t in ids["canvas_ids"].split(",")]
        out["prompt_ids"] = [int(t) for t in ids["prompt_ids"].split(",")]
        out["forwards"] = int(ids["forwards"])
    return out


# Linux keeps a process's peak RSS across exec (the largest of the memory it had before exec and its
# own), so a child started from this large process reports this process's peak: the command runs as
# the child of a small launcher instead, whose own memory (about 10 MB) is the floor of the figure.
LAUNCHER = ("import os, sys; pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ); "
            "_, status, usage = os.wait4(pid, 0); open(sys.argv[1], 'w').write(str(usage.ru_maxrss)); "
            "sys.exit(os.waitstatus_to_exitcode(status))")


def measured(cmd: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True), with the command's own peak RSS as
    `peak_rss_bytes` (wait4's rusage of it, through LAUNCHER)."""
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".maxrss") as f:
        done = subprocess.run([sys.executable, "-c", LAUNCHER, f.name, *cmd], capture_output=True, text=True,
                              errors="replace", env=env)
        kb = f.read().strip()
    done.args, done.peak_rss_bytes = cmd, int(kb) * 1024 if kb else None       # Linux: kilobytes
    return done


# -- fastdllm -----------------------------------------------------------------------------------------

def load_fastdllm(path: Path, precision: str):
    """fp32 / bf16 (dtype), int8 / int4 (load(..., quantize=...)): the model, or why not."""
    try:
        if precision in ("fp32", "bf16"):
            return loading.load(path, dtype=precision, device="cpu"), None
        return loading.load(path, dtype="bf16", device="cpu", quantize=precision), None
    except Exception as e:                                      # noqa: BLE001 (said in the table)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def fastdllm(lm, prompt: list[int], cfg: DecodeConfig) -> dict:
    batch = stepper(lm.decoder, [prompt], cfg)
    start = time.perf_counter()
    for _ in batch.events():
        pass
    return {"seconds": time.perf_counter() - start, "forwards": batch.nfe, "ids": batch.generated()[0].tolist()}


def fastdllm_peak(path: Path, precision: str, prompt: list[int], cfg: DecodeConfig, threads: int) -> dict:
    """fastdllm's peak memory for one run: a fresh process loads `path` at `precision` and decodes
    `prompt` once under `cfg` (load_fastdllm and fastdllm above); its peak RSS and forwards."""
    code = ("import json, sys, torch; sys.path.insert(0, sys.argv[1]); import llamacpp_runs as r; "
            "from fastdllm.decode.config import DecodeConfig; "
            "path, precision, prompt, cfg, threads = json.loads(sys.argv[2]); torch.set_num_threads(threads); "
            "lm, why = r.load_fastdllm(path, precision); assert lm is not None, why; "
            "print(json.dumps(r.fastdllm(lm, prompt, DecodeConfig(**cfg))['forwards']))")
    args = json.dumps([str(path), precision, prompt, cfg.to_dict(), threads])
    p = measured([sys.executable, "-c", code, str(Path(__file__).resolve().parent), args])
    if p.returncode:
        raise SystemExit(f"fastdllm's memory run failed ({p.returncode}): {precision} {path}\n{p.stderr[-3000:]}")
    return {"peak_rss_bytes": p.peak_rss_bytes, "forwards": json.loads(p.stdout.splitlines()[-1])}


def fastdllm_peaks(rows: list[dict], path: Path, prompt: list[int], threads: int) -> None:
    """Each fastdllm row's (one with a "cfg") peak RSS, from fastdllm_peak; the cfg is taken off the row."""
    for row in rows:
        if "cfg" in row:
            peak = fastdllm_peak(path, row["precision"], prompt, row.pop("cfg"), threads)
            row["peak_rss_bytes"] = peak["peak_rss_bytes"]


def cfg_of(a, rule: str, cache: str, steps: int | None = None) -> DecodeConfig:
    return DecodeConfig(gen_len=a.gen_len, block_len=a.block_len, cache=cache, rule=rule, steps=steps,
                        threshold=a.threshold, early_stop=False)


# -- measurement -----------------------------------------------------------------------------------

class Hog:
    """A spinning process pinned to one core (taskset), while `with`."""

    def __init__(self, core: int):
        self.core = core

    def __enter__(self):
        self.p = subprocess.Popen(["taskset", "-c", str(self.core), sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)

    def __exit__(self, *exc):
        self.p.kill()
        self.p.wait()


def timed(rows: list[dict], reps: int, busy: int | None) -> None:
    """Run every row's `run()` reps times, interleaved (A B C A B C ...); with `busy`, each repetition
    once quiet and once beside a hog on core `busy`. Fills row['quiet'] / row['busy']: run dicts."""
    for row in rows:
        row["quiet"], row["busy"] = [], []
    for rep in range(reps):
        for cond in (["quiet", "busy"] if busy is not None else ["quiet"]):
            ctx = Hog(busy) if cond == "busy" else None
            if ctx:
                ctx.__enter__()
            try:
                for row in rows:
                    r = row["run"]()
                    for key in ("ids", "prompt_ids", "text"):
                        r.pop(key, None)
                    row[cond].append(r)
                    print(f"  [{cond} {rep + 1}/{reps}] {row['tool']:9s} {row['setting']:38s} {row['precision']:5s} "
                          f"{r['seconds']:8.3f} s  {r['forwards']} fwd  load {loadavg()}", file=sys.stderr, flush=True)
            finally:
                if ctx:
                    ctx.__exit__()


def summary(row: dict, gen_len: int) -> dict:
    out = {k: v for k, v in row.items() if k not in ("run", "quiet", "busy")}
    for cond in ("quiet", "busy"):
        runs = row.get(cond) or []
        if not runs:
            continue
        per_fwd = [1000 * r["seconds"] / r["forwards"] for r in runs]
        tps = [gen_len / r["seconds"] for r in runs]
        out[cond] = {"ms_per_forward": statistics.median(per_fwd), "ms_per_forward_spread": span(per_fwd),
                     "tokens_per_s": statistics.median(tps), "tokens_per_s_spread": span(tps),
                     "forwards": runs[0]["forwards"], "seconds": [r["seconds"] for r in runs]}
        if "peak_rss_bytes" in runs[0]:                  # llama.cpp: each run its own process
            out.setdefault("peak_rss_bytes", max(r["peak_rss_bytes"] for r in runs))
        if all("sampling_s" in r for r in runs):
            out[cond]["sampling_ms_per_forward"] = statistics.median(
                1000 * r["sampling_s"] / r["forwards"] for r in runs)
    if "busy" in out and "quiet" in out:
        out["busy_slowdown"] = out["busy"]["ms_per_forward"] / out["quiet"]["ms_per_forward"]
    return out
