#!/usr/bin/env python3
"""Load test of `fastdllm serve` (a benchmark, not a test).

    python benchmarks/serve_bench.py                                   # built-in model, CPU
    python benchmarks/serve_bench.py -m DIR --dtype bf16 --max-tokens 256 --requests 64

For each --max-batch setting a real server process is started on a free loopback port; then
--requests completions (the built-in code prompts, cycled) are sent at each concurrency by that
many clients, each sending its next request when the previous one is answered. Printed per row:
requests/s, generated tokens/s (answer tokens only), p50/p95 latency, and the mean rows per
batched forward (from the server's /metrics). Greedy answers are identical in every row.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness
import httpx

from fastdllm.bench.prompts import builtin


def main() -> None:
    ap = harness.parser(__doc__, reps=None, device="auto", dtype="auto")   # --threads: the server's (FASTDLLM_THREADS)
    ap.add_argument("-m", "--model", help="checkpoint directory (default: the built-in model)")
    ap.add_argument("-P", "--profile", help="the server's profile")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=32, help="requests per row")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--max-batch", default="8,1", help="server settings to compare")
    args = ap.parse_args()

    prompts = builtin("code").prompts
    rows = []
    for max_batch in harness.csv(args.max_batch, int):
        with Server(args, max_batch) as server:
            for concurrency in harness.csv(args.concurrency, int):
                rows.append(run_load(server, prompts, args, concurrency, max_batch))
                print(format_row(rows[-1]), file=sys.stderr)
    print(conditions(args))
    print("| max batch | concurrency | requests/s | tokens/s | p50 latency s | p95 latency s | mean batch |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(format_row(row))
    harness.write_json(args, rows, run=conditions(args))


class Server:
    """`fastdllm serve` in its own process, on a free loopback port."""

    def __init__(self, args, max_batch: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [str(Path(sys.executable).with_name("fastdllm")), "serve",
                        "--port", str(self.port), "--max-batch", str(max_batch), "--max-queue", "1024",
                        "--dtype", args.dtype, "--device", args.device]
        self.command += ["-m", args.model] if args.model else []
        self.command += ["-P", args.profile] if args.profile else []
        self.threads = args.threads

    def __enter__(self) -> "Server":
        env = {**os.environ, **({"FASTDLLM_THREADS": str(self.threads)} if self.threads else {})}
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"the server exited with {self.process.returncode}: {' '.join(self.command)}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    self.model = httpx.get(self.url + "/v1/models").json()["data"][0]["id"]
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        sys.exit("the server did not start within 300 s")

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(60)


def run_load(server: Server, prompts: list[str], args, concurrency: int, max_batch: int) -> dict:
    before = batch_rows(server)
    latencies, tokens = [], []
    todo = list(range(args.requests))

    async def client(http: httpx.AsyncClient) -> None:
        while todo:
            i = todo.pop()
            began = time.perf_counter()
            reply = await http.post(server.url + "/v1/completions", json={
                "model": server.model, "prompt": prompts[i % len(prompts)], "max_tokens": args.max_tokens})
            reply.raise_for_status()
            latencies.append(time.perf_counter() - began)
            tokens.append(reply.json()["usage"]["completion_tokens"])

    async def load() -> float:
        async with httpx.AsyncClient(timeout=None) as http:
            began = time.perf_counter()
            await asyncio.gather(*(client(http) for _ in range(concurrency)))
            return time.perf_counter() - began

    wall = asyncio.run(load())
    after = batch_rows(server)
    forwards = after[1] - before[1]
    return {"max_batch": max_batch, "concurrency": concurrency, "requests_s": len(latencies) / wall,
            "tokens_s": sum(tokens) / wall, "p50": statistics.median(latencies),
            "p95": percentile(latencies, 0.95), "mean_batch": (after[0] - before[0]) / max(forwards, 1)}


def batch_rows(server: Server) -> tuple[float, float]:
    """(sum of rows over batched forwards, number of forwards) from /metrics."""
    text = httpx.get(server.url + "/metrics").text
    found = dict(re.findall(r"^fastdllm_batch_rows_(sum|count) (\S+)$", text, re.M))
    return float(found.get("sum", 0)), float(found.get("count", 0))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def format_row(r: dict) -> str:
    return (f"| {r['max_batch']} | {r['concurrency']} | {r['requests_s']:.2f} | {r['tokens_s']:.1f} | "
            f"{r['p50']:.2f} | {r['p95']:.2f} | {r['mean_batch']:.2f} |")


def conditions(args) -> str:
    device = harness.machine(args.device, args.dtype)
    return (f"model {args.model or 'built-in'} · profile {args.profile or 'the model default'} · dtype {args.dtype} · "
            f"{device} · max_tokens {args.max_tokens} · {args.requests} requests per row · code prompts")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
