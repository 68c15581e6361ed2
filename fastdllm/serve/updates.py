"""One request's job on the event loop's side: `start` submits it to the scheduler, `Updates`
receives what the scheduler's worker thread delivers, `follow` yields it, `settle` ends it (the job
cancelled unless it finished, one log line). The scheduler is the app's (`request.app.state`)."""

from __future__ import annotations

import asyncio
import sys
import time

from fastapi import Request

from .errors import ApiError
from .jobs import Failed, Finished, Job, QueueFull, ShuttingDown
from .server import Prepared

POLL_SECONDS = 0.5          # how often a waiting request looks whether its client is still there
CLIENT_GONE = 499           # nginx's "client closed request": what the metrics count for it


class Updates:
    """One job's updates on the event loop's side. `deliver` runs on the scheduler's worker thread;
    `next` waits for the next update and looks at the client between updates (None: it went away)."""

    def __init__(self, request: Request):
        self.request = request
        self.scheduler = request.app.state.scheduler
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.final: Finished | Failed | None = None
        self.started = time.perf_counter()
        self._get: asyncio.Future | None = None   # kept across timeouts: a timed-out get never loses an update
        self._checked = self.loop.time()

    def deliver(self, update) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, update)
        except RuntimeError:        # the event loop is closed: nobody is waiting for this answer
            pass

    async def next(self):
        while True:
            if self._get is None:
                self._get = asyncio.ensure_future(self.queue.get())
            done, _ = await asyncio.wait({self._get}, timeout=POLL_SECONDS)
            update = None
            if done:
                update, self._get = self._get.result(), None
                if isinstance(update, (Finished, Failed)):
                    self.final = update
                    return update               # the answer is whole: sent even to a client that may be gone
            # looked at between updates too: a step stream may never leave a pause
            if self.loop.time() - self._checked >= POLL_SECONDS:
                self._checked = self.loop.time()
                if await self.request.is_disconnected():
                    return None
            if update is not None:
                return update

    async def last(self):
        while (update := await self.next()) is not None:
            if isinstance(update, (Finished, Failed)):
                return update
        return None

    def close(self) -> None:
        if self._get is not None:
            self._get.cancel()


def start(request: Request, prepared: Prepared, job_id: str) -> tuple[Job, Updates]:
    """The request's job, submitted; a full queue is a 429, a server shutting down a 503."""
    updates = Updates(request)
    job = Job(job_id, prepared.prompt, prepared.cfg, updates.deliver, stop=prepared.stop,
              steps=prepared.steps, suffix=prepared.suffix, constraint=prepared.constraint)
    try:
        updates.scheduler.submit(job)
    except QueueFull:
        raise ApiError(429, "the server's queue is full; retry later", kind="rate_limit_error",
                       code="queue_full", headers={"Retry-After": "1"}) from None
    except ShuttingDown:
        raise ApiError(503, "the server is shutting down", kind="server_error", code="shutting_down") from None
    return job, updates


async def follow(job: Job, updates: Updates):
    """A job's updates up to its end (ollama's answers); the job is settled however it ends."""
    try:
        while (update := await updates.next()) is not None:
            yield update
            if isinstance(update, (Finished, Failed)):
                return
    finally:
        settle(job, updates)


def settle(job: Job, updates: Updates) -> None:
    """The request is over: its job is cancelled unless it finished; its log line is written."""
    updates.close()
    if updates.final is None:
        updates.scheduler.cancel(job.id)
    log(job, updates.final, time.perf_counter() - updates.started)


def log(job: Job, final, seconds: float) -> None:
    """One line per request that reached the scheduler, on stderr."""
    if isinstance(final, Finished):
        status = f"200 {final.finish_reason}"
        figures = f"prompt {final.prompt_tokens} · completion {final.completion_tokens} · NFE {final.nfe}"
    else:
        status = f"{final.status} {final.message}" if isinstance(final, Failed) else f"{CLIENT_GONE} client gone"
        figures = f"prompt {len(job.prompt)}"
    sys.stderr.write(f"fastdllm serve: {job.id} · {figures} · {seconds:.2f} s · {status}\n")
    sys.stderr.flush()
