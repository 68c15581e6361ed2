"""How `fastdllm serve` stops on SIGTERM or Ctrl+C. uvicorn stops accepting connections and waits
for the open ones; this says on stderr what it waits for, and after --shutdown-timeout seconds
stops decoding: each running request is answered with the blocks it has finished (finish_reason
"abort"), each queued one with 503. A second Ctrl+C stops at once."""

from __future__ import annotations

import asyncio
import sys

import uvicorn


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, scheduler, timeout: float):
        super().__init__(config)
        self.scheduler, self.timeout = scheduler, timeout

    async def shutdown(self, sockets=None) -> None:
        running, queued = self.scheduler.load()
        timer = None
        if running or queued:
            say(f"stopping: waiting up to {self.timeout:g} s (--shutdown-timeout) for {requests(running, queued)}; "
                f"then each is answered with what it has (Ctrl+C again: stop now)")
            timer = asyncio.get_running_loop().call_later(self.timeout, self.give_up)
        else:
            say("stopping")
        try:
            await super().shutdown(sockets)
        finally:
            if timer is not None:
                timer.cancel()

    def give_up(self) -> None:
        running, queued = self.scheduler.load()
        answers = ([f"{running} running answered with the blocks decoded so far (finish_reason abort)"] if running
                   else []) + ([f"{queued} queued with 503"] if queued else [])
        if answers:
            say(f"stopping: {self.timeout:g} s passed: {', '.join(answers)}")
        self.scheduler.abort()


def requests(running: int, queued: int) -> str:
    counts = " and ".join([f"{running} running"] * bool(running) + [f"{queued} queued"] * bool(queued))
    return f"{counts} request{'s' * (running + queued != 1)}"


def say(line: str) -> None:
    sys.stderr.write(f"fastdllm serve: {line}\n")
    sys.stderr.flush()
