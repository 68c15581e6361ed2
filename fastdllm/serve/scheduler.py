"""The batching scheduler: one worker thread owns the model and decodes the queued jobs in batches.

Jobs whose settings agree (rows.batch_key) share a batch. A batch is a stepper (decode/engine.py)
over its rows' prompts plus what each has decoded so far; at a block boundary it may be re-planned:

- a row that is finished (end token, stop string, its length used up) or cancelled leaves, so it
  costs nothing from the next block on;
- queued jobs that can join (same settings, room under --max-batch, the canvas fits the context)
  join, taken from the front of the queue up to the first one that cannot (first come, first
  served: a job that needs other settings is never overtaken for long; it starts when the running
  batch drains).

Re-planning is exact: under bidirectional attention every block starts with a full refresh of the
canvas anyway, and under block-causal attention the finished blocks are recomputed once (prefill)
with the same, final, keys and values. A greedy row's tokens are therefore the ones it gets alone
(tests/serve/test_scheduler.py checks this in float64). Sampled jobs (temperature > 0, or random
confidence) are decoded alone, so that a seed reproduces `fastdllm generate --seed`; so are
infilling jobs (OpenAI's `suffix`: a canvas of prompt, hole and suffix) and those whose settings
read the whole answer (Prophet, DPad: rows.whole_answer), which never re-plan.
"""

from __future__ import annotations

import collections
import sys
import threading
import time

from ..decode.events import StepEvent
from ..errors import UserError
from .jobs import Failed, Job, QueueFull, ShuttingDown
from .rows import Row, batch_key, config_for, fits


class Scheduler:
    def __init__(self, decoder, *, max_batch: int = 8, max_queue: int = 64, metrics=None, leader=None):
        self.decoder, self.max_batch, self.max_queue, self.metrics = decoder, max_batch, max_queue, metrics
        self.queue: collections.deque[Job] = collections.deque()
        self.cancelled: set[str] = set()      # running jobs whose clients went away
        self.active: set[str] = set()         # the ids of the running rows
        self.lock = threading.Condition()
        self.accepting = True
        self.running = False
        self.aborting = False                 # the shutdown's wait ran out: answer what is decided
        self.thread: threading.Thread | None = None
        self.leader = leader                  # serve --tp: the other ranks decode every batch with us (followers.py)

    # --- the HTTP side (any thread) -----------------------------------------------------------
    def start(self) -> None:
        self.running = True
        self.thread = threading.Thread(target=self._work, name="fastdllm-scheduler", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self.lock:
            if not self.accepting:
                raise ShuttingDown("the server is shutting down")
            if len(self.queue) >= self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} requests waiting)")
            job.submitted = time.perf_counter()
            self.queue.append(job)
            self._queue_changed()
            self.lock.notify()

    def cancel(self, job_id: str) -> None:
        with self.lock:
            waiting = [j for j in self.queue if j.id == job_id]
            for job in waiting:
                self.queue.remove(job)
            if not waiting and job_id in self.active:
                self.cancelled.add(job_id)          # a running row: it leaves at the next boundary
            self._queue_changed()

    def load(self) -> tuple[int, int]:
        """(running, queued) jobs: what a shutdown waits for."""
        with self.lock:
            return len(self.active), len(self.queue)

    def abort(self) -> None:
        """Stop decoding (the shutdown's wait ran out): after its next forward each running job is
        answered with the blocks it has finished (finish_reason "abort"); each queued job gets 503
        now; no new job is taken."""
        with self.lock:
            self.accepting = False
            self.aborting = True
            queued = list(self.queue)
            self.queue.clear()
            self._queue_changed()
        for job in queued:
            job.deliver(Failed(503, "the server is shutting down"))

    def shutdown(self, timeout: float | None = None) -> None:
        """Take no new jobs; the queued and running ones are finished; then the worker stops."""
        with self.lock:
            self.accepting = False
            self.running = False
            self.lock.notify()
        if self.thread is not None:
            self.thread.join(timeout)

    @property
    def queue_depth(self) -> int:
        return len(self.queue)

    # --- the worker ---------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self.lock:
                while not self.queue and self.running:
                    self.lock.wait()
                if not self.queue:
                    if self.leader:
                        self.leader.stop()
                    return                          # shut down and drained
                first = self.queue.popleft()
                self.active.add(first.id)
                self._queue_changed()
            rows = [Row(first, self.decoder)]
            try:
                self._decode(rows)
            except Exception as e:                  # an engine failure fails this batch, not the server
                print(f"fastdllm serve: batch of {len(rows)} failed: {type(e).__name__}: {e}", file=sys.stderr)
                for row in rows:
                    if not row.finished:
                        row.job.deliver(Failed(500, f"the engine failed: {type(e).__name__}: {e}"))
                self._retire(rows)

    def _decode(self, rows: list[Row]) -> None:
        """Decode `rows` (and whoever joins them) until every row has finished."""
        from ..decode.engine import stepper

        key = batch_key(rows[0].job)
        while rows:
            self._admit(rows, key)
            cfg = config_for(key, max(r.remaining for r in rows))
            for row in rows:
                row.planned()
            try:
                args = rows[0].batch_args(rows, cfg)
                batch = stepper(self.decoder, **args)
            except UserError as e:                  # the app checks lengths first; this is a guard
                for row in rows:
                    row.job.deliver(Failed(400, str(e)))
                    row.finished = True
                self._retire(rows)
                return
            if self.leader:
                self.leader.plan(args, [r.job.id for r in rows], [r.job.cfg.seed for r in rows])
            began = time.perf_counter()
            for event in batch.events():
                now = time.perf_counter()
                if isinstance(event, StepEvent):    # a forward
                    for i, row in enumerate(rows):
                        row.stepped(event, i, len(rows))
                    if self.metrics:
                        self.metrics.forward(now - began, len(rows))
                    began = now
                else:
                    region = batch.generated()      # a block boundary
                    end = batch.canvas.blocks[event.block][1]
                    matchers = batch.constraint         # constrained rows: their failures (Stepper declares it)
                    for i, row in enumerate(rows):
                        row.block_done(region[i], end - batch.canvas.starts[i], self._take_cancel(row.job.id),
                                       self.metrics, failure=matchers.errors[i] if matchers else None)
                    if any(r.finished for r in rows) or self._joinable(rows, key):
                        self._tell(leave=True)
                        break                       # re-plan: rows leave or join
                    began = time.perf_counter()
                if self.aborting:
                    self._tell(leave=True)
                    break
                self._tell(leave=False)
            else:
                unfinished = [r.job.id for r in rows if not r.finished]
                if unfinished:                      # the engine ended the batch: every row must be done
                    raise RuntimeError(f"the batch ended before rows {unfinished} finished")
            if self.aborting:                       # before another forward: what each row has is its answer
                for row in rows:
                    if not row.finished:
                        row.abort(self.metrics)
            self._retire([r for r in rows if r.finished])
            rows[:] = [r for r in rows if not r.finished]

    def _tell(self, leave: bool) -> None:
        """serve --tp: after each event, whether the followers leave the batch with us."""
        if self.leader:
            self.leader.stepped(leave)

    def _retire(self, rows: list[Row]) -> None:
        with self.lock:
            for row in rows:
                self.active.discard(row.job.id)
                self.cancelled.discard(row.job.id)

    def _take_cancel(self, job_id: str) -> bool:
        with self.lock:
            if job_id in self.cancelled:
                self.cancelled.discard(job_id)
                return True
            return False

    def _joinable(self, rows: list[Row], key) -> bool:
        with self.lock:
            return bool(self.queue) and len(rows) < self.max_batch and self._fits_next(rows, key)

    def _fits_next(self, rows: list[Row], key) -> bool:
        job = self.queue[0]
        return batch_key(job) == key and fits(self.decoder, [*rows, Row(job, self.decoder)], key)

    def _admit(self, rows: list[Row], key) -> None:
        """Queued jobs join from the front of the queue up to the first that cannot."""
        with self.lock:
            while self.queue and len(rows) < self.max_batch and self._fits_next(rows, key):
                rows.append(Row(self.queue.popleft(), self.decoder))
                self.active.add(rows[-1].job.id)
            self._queue_changed()

    def _queue_changed(self) -> None:
        if self.metrics:
            self.metrics.queue_depth(len(self.queue))
