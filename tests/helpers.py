"""What several test files share (no test file imports another): random prompts, the CLI's small
decoding flags, the eval tasks folder, the one-line error check, the W8A8 activation definition.
The CLI itself is run through cli_runner.invoke. One group's shared pieces have a module each beside
this one (gguf_decode, device_batches, steerling_trace, moe_trace, dus_trace, dkv_trace, pull_repo)."""

from __future__ import annotations

from pathlib import Path

import torch

SMALL = ["-n", "32", "--block-len", "16"]        # a short answer in two blocks
TASKS = Path(__file__).resolve().parent / "eval_task"     # lm-eval tasks over the tiny checkpoints
QWEN_IDS = dict(low=1000, high=30000)            # prompt_of: ordinary ids of the Qwen BPE (tiny_blockdiff, _rnd1, _sdar_moe)
BYTE_IDS = dict(seed=None, low=1000, high=1256)  # prompt_of: the byte tokens of tiny_nemotron's tokenizer


def prompt_of(length: int, seed: int | None = 0, *, low: int = 10, high: int = 4000) -> list[int]:
    """`length` token ids uniform in [low, high), from a generator seeded by `seed` (None: by the length)."""
    g = torch.Generator().manual_seed(length if seed is None else seed)
    return torch.randint(low, high, (length,), generator=g).tolist()


def upto_stop(ids: list[int], stop: int) -> list[int]:
    return ids[:ids.index(stop)] if stop in ids else ids


def one_error(stderr: str, words: str) -> bool:
    """The run ended with one `error:` line holding `words`, and no traceback."""
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    return len(errors) == 1 and words in errors[0] and "Traceback" not in stderr


def fake_quant(x: torch.Tensor) -> torch.Tensor:
    """The W8A8 definition's activations, float64: per row s = max|x| / 127 (fp32), q = round(x / s)
    in fp32, clamped to +-127; returns q * s."""
    xf = x.float()
    s = (xf.abs().amax(-1, keepdim=True) / 127).clamp_min(1e-30)
    return torch.round(xf / s).clamp(-127, 127).double() * s.double()


def scheduler_answers(decoder, prompts: dict[str, list[int]], cfg, timeout: float = 300) -> dict:
    """Each prompt submitted at once to serve's Scheduler (rows batched as serve batches them):
    name -> its Finished update."""
    import threading

    from fastdllm.serve.jobs import Finished, Job
    from fastdllm.serve.scheduler import Scheduler

    done, got = threading.Semaphore(0), {}
    sched = Scheduler(decoder, max_batch=4)
    for name, prompt in prompts.items():
        sched.submit(Job(name, prompt, cfg, deliver=lambda u, n=name: isinstance(u, Finished) and
                         (got.__setitem__(n, u), done.release())))
    sched.start()
    for _ in prompts:
        assert done.acquire(timeout=timeout)
    sched.shutdown(10)
    return got


def use_hub(monkeypatch, url: str, cache) -> None:
    """Point huggingface_hub (and fastdllm's hub settings) at a local hub server and cache."""
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")


def one_error_line(out) -> str:
    """A CLI result that failed (exit 1) with exactly one `error:` line; that line."""
    assert out.exit_code == 1, out.output
    assert out.output.startswith("error: ") and out.output.count("\n") == 1, out.output
    return out.output
