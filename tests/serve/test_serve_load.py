"""Many clients at once: 16 concurrent clients send 64 completions of different prompts and lengths
to one server (a tiny LLaDA, float64, batches of up to 8 that rows join and leave at block boundaries). Every
request gets a 200, none is lost or answered twice, and every answer is token for token the one
the engine gives the same request alone."""

from __future__ import annotations

import asyncio

import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from serve_process import ServerProcess  # noqa: E402

from fastdllm.bench.prompts import builtin  # noqa: E402
from fastdllm.checkpoints import loading  # noqa: E402
from fastdllm.decode import profiles  # noqa: E402
from fastdllm.decode.engine import run  # noqa: E402

CLIENTS, REQUESTS = 16, 64
LENGTHS = (32, 64, 96)          # max_tokens: one, two or three blocks


@pytest.mark.slow
def test_16_clients_64_requests_each_answer_as_alone(llada_dir):
    prompts = builtin("code").prompts
    work = [(i, prompts[i % len(prompts)], LENGTHS[i % len(LENGTHS)]) for i in range(REQUESTS)]
    server = ServerProcess("-m", llada_dir, "--dtype", "fp64", "--max-batch", "8", "--block-len", "32")
    try:
        answers = asyncio.run(_send_all(server.v1, work, llada_dir.name))
        metrics = httpx.get(server.url + "/metrics").text
    finally:
        assert server.stop() == 0, server.log

    assert sorted(answers) == list(range(REQUESTS))                          # none lost, none twice
    assert all(status == 200 for status, _ in answers.values()), answers
    assert len({body["id"] for _, body in answers.values()}) == REQUESTS
    rows_sum = float(_metric(metrics, "fastdllm_batch_rows_sum"))
    forwards = float(_metric(metrics, "fastdllm_batch_rows_count"))
    assert rows_sum / forwards > 2                                           # they were batched

    threads = torch.get_num_threads()
    torch.set_num_threads(1)                # tiny float64 ops: threads only add overhead
    lm = loading.load(llada_dir, dtype="fp64")
    base = profiles.resolve(profiles.find(profiles.default_profile_for(llada_dir)), {"block_len": 32}, llada_dir)
    alone: dict[tuple[str, int], list[int]] = {}
    for i, prompt, max_tokens in work:
        if (prompt, max_tokens) not in alone:
            cfg = base.__class__.from_dict({"gen_len": max_tokens}, base)
            alone[prompt, max_tokens] = run(lm.decoder, [lm.encode(prompt, chat=False)], cfg).ids[0]
        assert answers[i][1]["fastdllm"]["completion_ids"] == alone[prompt, max_tokens], (i, prompt, max_tokens)
    torch.set_num_threads(threads)


async def _send_all(v1: str, work: list, model: str) -> dict[int, tuple[int, dict]]:
    queue: asyncio.Queue = asyncio.Queue()
    for item in work:
        queue.put_nowait(item)
    answers: dict[int, tuple[int, dict]] = {}

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            i, prompt, max_tokens = queue.get_nowait()
            reply = await http.post(v1 + "/completions", json={"model": model, "prompt": prompt,
                                                               "max_tokens": max_tokens})
            assert i not in answers
            answers[i] = (reply.status_code, reply.json())

    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(*(client(http) for _ in range(CLIENTS)))
    return answers


def _metric(text: str, name: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    return line.split()[1]
