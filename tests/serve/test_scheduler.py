"""The serve scheduler (no HTTP): rows of different lengths share batches, join and leave at block
boundaries, and each answer is token for token the one its job gets alone (float64); stop strings,
cancellation, a full queue and an engine failure."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from fastdllm.checkpoints import loading
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.serve.jobs import Failed, Finished, Job, QueueFull, StepUpdate, TextUpdate
from fastdllm.serve.scheduler import Scheduler

PROMPTS = ["Hi.", "Explain the block-wise KV cache in two sentences, please.", "What is 2 + 2?",
           "Write a haiku about caches.", "def add(a, b):"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sdar64(tiny):
    return loading.load(tiny("sdar"), dtype="fp64")


@pytest.fixture(scope="module")
def v264(tiny):
    return loading.load(tiny("fast_dllm_v2"), dtype="fp64")


class Collector:
    """Each job's updates, in order; `wait()` until every submitted job has its last one."""

    def __init__(self):
        self.updates: dict[str, list] = {}
        self.done = threading.Condition()

    def job(self, name: str, prompt: list[int], cfg: DecodeConfig, **kw) -> Job:
        self.updates[name] = []
        return Job(name, prompt, cfg, deliver=lambda u, n=name: self._add(n, u), **kw)

    def _add(self, name: str, update) -> None:
        with self.done:
            self.updates[name].append(update)
            self.done.notify_all()

    def last(self, name: str):
        return self.updates[name][-1]

    def wait(self, names, timeout: float = 120) -> None:
        with self.done:
            ok = self.done.wait_for(lambda: all(self.updates[n] and isinstance(self.updates[n][-1], (Finished, Failed))
                                                for n in names), timeout)
        assert ok, {n: self.updates[n][-1:] for n in names}


def scheduler(lm, **kw) -> Scheduler:
    s = Scheduler(lm.decoder, **kw)
    s.start()
    return s


@pytest.mark.parametrize("family, cfg, lengths", [
    ("llada64", DecodeConfig(gen_len=48, block_len=8, cache="dual", threshold=0.7, early_stop=False), [48, 16, 32, 24, 8]),
    ("dream64", DecodeConfig(gen_len=32, block_len=8, cache="prefix", threshold=0.7), [32, 8, 24, 16, 32]),
    ("sdar64", DecodeConfig(gen_len=16, block_len=4, rule="dynamic", threshold=0.7, early_stop=False), [16, 8, 4, 12, 16]),
    ("v264", DecodeConfig(gen_len=64, block_len=32, sub_block_len=8, rule="dynamic", threshold=0.7, cache="prefix",
                          early_stop=False), [64, 32, 64, 32, 64]),
])
def test_rows_join_and_leave_and_each_answer_is_its_answer_alone(request, family, cfg, lengths):
    lm = request.getfixturevalue(family)
    prompts = [lm.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    got = Collector()
    sched = scheduler(lm, max_batch=4)
    names = [f"r{i}" for i in range(len(prompts))]
    jobs = [got.job(n, p, replace(cfg, gen_len=g), steps=(n == "r0")) for n, p, g in zip(names, prompts, lengths)]
    joined = threading.Event()

    def first_step(update, deliver=jobs[0].deliver):    # the others arrive while r0 decodes its first block
        deliver(update)
        if isinstance(update, StepUpdate) and not joined.is_set():
            joined.set()
            for job in jobs[1:]:
                sched.submit(job)

    jobs[0].deliver = first_step
    sched.submit(jobs[0])
    got.wait(names)
    sched.shutdown(10)
    for name, job in zip(names, jobs):
        alone = run(lm.decoder, [job.prompt], job.cfg)
        finished = got.last(name)
        assert isinstance(finished, Finished), finished
        assert finished.ids == alone.ids[0]
        assert finished.text == alone.texts[0] == "".join(u.text for u in got.updates[name] if isinstance(u, TextUpdate))
        assert finished.completion_tokens == len(alone.ids[0]) and finished.prompt_tokens == len(job.prompt)
        if lm.model.attention.kind == "bidirectional":
            assert finished.nfe == alone.nfe and finished.committed == alone.committed
    print(family, [round(got.last(n).mean_batch, 2) for n in names], [got.last(n).nfe for n in names])
    assert got.last("r0").mean_batch > 1                                # the others joined it mid-way
    assert got.last("r4").mean_batch <= 4                              # --max-batch held
    steps = [u for u in got.updates["r0"] if isinstance(u, StepUpdate)]
    assert sum(len(u.positions) for u in steps) >= got.last("r0").completion_tokens
    assert all(0 <= p < lengths[0] + cfg.block_len for u in steps for p in u.positions)


def test_a_finished_row_leaves_and_stops_costing_forwards(llada64):
    cfg = DecodeConfig(gen_len=8, block_len=8, cache="dual", threshold=0.7, early_stop=False)
    prompts = [llada64.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS[:2]]
    got = Collector()
    sched = Scheduler(llada64.decoder, max_batch=4)     # submitted before the worker starts: one batch
    sched.submit(got.job("short", prompts[0], cfg))
    sched.submit(got.job("long", prompts[1], replace(cfg, gen_len=40)))
    sched.start()
    got.wait(["short", "long"])
    sched.shutdown(10)
    short, long = got.last("short"), got.last("long")
    alone = run(llada64.decoder, [prompts[1]], replace(cfg, gen_len=40))
    assert long.ids == alone.ids[0] and long.nfe == alone.nfe
    assert short.mean_batch == 2                        # every forward it took part in was shared
    assert long.mean_batch < 2                          # after the first block it ran alone
    assert short.finish_reason == "length"


def test_stop_strings_cut_the_answer(llada64):
    cfg = DecodeConfig(gen_len=32, block_len=8, cache="dual", threshold=0.7, early_stop=False)
    prompt = llada64.tokenizer(PROMPTS[1], add_special_tokens=False)["input_ids"]
    full = run(llada64.decoder, [prompt], cfg).texts[0]
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert len(full) > 8 and stop.strip()
    got = Collector()
    sched = scheduler(llada64)
    sched.submit(got.job("a", prompt, cfg, stop=(stop, "never seen")))
    got.wait(["a"])
    sched.shutdown(10)
    finished = got.last("a")
    assert finished.text == full[:full.index(stop)] and finished.finish_reason == "stop"
    assert "".join(u.text for u in got.updates["a"] if isinstance(u, TextUpdate)) == finished.text
    assert llada64.detokenize(finished.ids).startswith(finished.text)


def test_a_cancelled_row_gets_nothing_more_and_the_others_finish(llada64):
    cfg = DecodeConfig(gen_len=48, block_len=8, cache="dual", threshold=0.7, early_stop=False)
    prompts = [llada64.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS[:3]]
    got = Collector()
    sched = Scheduler(llada64.decoder, max_batch=4)
    jobs = [got.job(n, p, cfg, steps=True) for n, p in zip("abc", prompts)]
    for job in jobs:
        sched.submit(job)
    sched.submit(got.job("queued", prompts[0], replace(cfg, block_len=4)))   # other settings: waits
    sched.cancel("queued")
    cancelled = threading.Event()

    def cancel_b(update, deliver=jobs[1].deliver):
        deliver(update)
        if not cancelled.is_set():
            cancelled.set()
            sched.cancel("b")

    jobs[1].deliver = cancel_b
    sched.start()
    got.wait(["a", "c"])
    sched.shutdown(10)
    assert not any(isinstance(u, (Finished, Failed)) for u in got.updates["b"])
    assert len(got.updates["b"]) <= 1 + 8               # at most the rest of its first block's steps
    assert got.updates["queued"] == []
    for name, prompt in (("a", prompts[0]), ("c", prompts[2])):
        assert got.last(name).ids == run(llada64.decoder, [prompt], cfg).ids[0]


def test_a_full_queue_refuses_and_an_engine_failure_fails_only_its_batch(llada64):
    cfg = DecodeConfig(gen_len=8, block_len=8, cache="dual", threshold=0.7)
    prompt = llada64.tokenizer("Hi.", add_special_tokens=False)["input_ids"]
    got = Collector()
    sched = Scheduler(llada64.decoder, max_queue=2)
    sched.submit(got.job("bad", [llada64.model.config.vocab_size + 5], cfg))   # no such token: the engine fails
    sched.submit(got.job("good", prompt, replace(cfg, block_len=4)))            # another batch
    with pytest.raises(QueueFull):
        sched.submit(got.job("third", prompt, cfg))
    sched.start()
    got.wait(["bad", "good"])
    sched.shutdown(10)
    assert isinstance(got.last("bad"), Failed) and got.last("bad").status == 500
    assert got.last("good").ids == run(llada64.decoder, [prompt], replace(cfg, block_len=4)).ids[0]


def test_sampled_jobs_are_decoded_alone_and_reproduce_their_seed(llada64):
    cfg = DecodeConfig(gen_len=16, block_len=8, cache="dual", threshold=0.7, temperature=0.8, seed=7)
    prompts = [llada64.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS[:3]]
    got = Collector()
    sched = Scheduler(llada64.decoder, max_batch=8)
    for name, prompt in zip("abc", prompts):
        sched.submit(got.job(name, prompt, cfg))
    sched.start()
    got.wait(list("abc"))
    sched.shutdown(10)
    for name, prompt in zip("abc", prompts):
        assert got.last(name).mean_batch == 1
        assert got.last(name).ids == run(llada64.decoder, [prompt], cfg).ids[0]


def test_an_infilling_job_is_decoded_alone_beside_a_batch(llada64, sdar64):
    from fastdllm.decode import infill
    from fastdllm.serve.protocol import prepare_completion
    from fastdllm.serve.errors import ApiError
    from fastdllm.serve.server import Server

    cfg = DecodeConfig(gen_len=16, block_len=8, cache="dual", threshold=0.7)
    prompt, suffix = llada64.encode("def f(x):\n", chat=False), llada64.encode("\n    return y\n", chat=False)
    ids = prompt + [llada64.specials.mask] * 16 + suffix
    alone = run(llada64.decoder, [ids], cfg, holes=[(len(prompt), len(prompt) + 16)])
    plain = [llada64.encode(p) for p in PROMPTS[:2]]
    c = Collector()
    jobs = [c.job("fill", prompt, cfg, suffix=suffix), *(c.job(f"p{i}", p, cfg) for i, p in enumerate(plain))]
    s = scheduler(llada64, max_batch=4)
    for job in jobs:
        s.submit(job)
    c.wait([j.id for j in jobs])
    s.shutdown()
    assert c.last("fill").ids == infill.cut(alone.holes[0][0], set(llada64.specials.stops), True)
    assert c.last("fill").text == alone.texts[0] and c.last("fill").mean_batch == 1.0
    for i, p in enumerate(plain):
        assert c.last(f"p{i}").ids == run(llada64.decoder, [p], cfg).ids[0]
    server = Server(sdar64, DecodeConfig(gen_len=16, block_len=4), "default", {})
    with pytest.raises(ApiError, match="cannot fill holes"):
        prepare_completion({"model": "tiny-sdar", "prompt": "x", "suffix": "y"}, server)


def test_a_dllm_cache_request_decodes_whole_as_alone(llada64):
    """The scheduler never re-plans a dllm_cache job at a block boundary (its schedule counts the
    answer's forwards and its features split the canvas at the prompt's end): a request that arrives
    while another decodes leaves both answers as they are alone."""
    from fastdllm.serve.rows import whole_answer

    cfg = DecodeConfig(gen_len=32, block_len=8, cache="dllm_cache", rule="fixed", prompt_interval=5,
                       gen_interval=3, transfer_ratio=0.25, early_stop=False)   # test_dllm_cache.py's settings
    assert whole_answer(cfg) and not whole_answer(DecodeConfig(cache="dual"))
    prompts = [llada64.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS[:2]]
    got, sched = Collector(), scheduler(llada64, max_batch=4)
    jobs = [got.job(f"r{i}", p, cfg, steps=i == 0) for i, p in enumerate(prompts)]
    sent = []

    def first_step(update, deliver=jobs[0].deliver):    # r1 arrives while r0 decodes its first block
        deliver(update)
        if isinstance(update, StepUpdate) and not sent:
            sent.append(sched.submit(jobs[1]))

    jobs[0].deliver = first_step
    sched.submit(jobs[0])
    got.wait(["r0", "r1"])
    sched.shutdown(10)
    for name, job in zip(["r0", "r1"], jobs):
        alone = run(llada64.decoder, [job.prompt], job.cfg)
        finished = got.last(name)
        assert isinstance(finished, Finished) and finished.ids == alone.ids[0] and finished.nfe == alone.nfe
