"""The OpenAI response shapes: whole answers and stream chunks, for chat (`chat.completion`,
`chat.completion.chunk`) and plain completions (`text_completion`). Each carries a `fastdllm`
object where fastdllm has something to add (the canvas, the step stream)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from ..checkpoints.plain_chat import cut_plain_answer
from .jobs import Finished, StepUpdate
from .server import Prepared
from .tools import parse_calls


def usage(f: Finished) -> dict:
    """OpenAI's counts and fastdllm's: forwards, answer tokens per forward and, beside them, the
    positions committed per forward (the end padding after the answer included)."""
    return {"prompt_tokens": f.prompt_tokens, "completion_tokens": f.completion_tokens,
            "total_tokens": f.prompt_tokens + f.completion_tokens, "nfe": f.nfe,
            "tokens_per_forward": round(f.tokens_per_forward, 4),
            "committed_per_forward": round(f.committed_per_forward, 4)}


def details(f: Finished, prepared: Prepared) -> dict:
    """The `fastdllm` object of a whole answer: the canvas, the answer's token ids (up to its end
    token, before a stop string's cut) and its timing."""
    return {**prepared.info(), "completion_ids": f.ids, "seconds": round(f.seconds, 4),
            "queued_seconds": round(f.queued_seconds, 4), "mean_batch": round(f.mean_batch, 3),
            **({"edits": f.edits} if prepared.cfg.edit_threshold is not None else {})}


@dataclass(frozen=True)
class Shape:
    chat: bool

    def new_id(self) -> str:
        return ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]

    def whole(self, job_id: str, model: str, f: Finished, prepared: Prepared) -> dict:
        text = cut_plain_answer(f.text) if prepared.plain_chat else f.text
        content, calls, finish = answer_calls(text, f.finish_reason, prepared)
        choice = ({"message": {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}}
                  if self.chat else {"text": text})
        return {"id": job_id, "object": "chat.completion" if self.chat else "text_completion",
                "created": int(time.time()), "model": model,
                "choices": [{"index": 0, **choice, "logprobs": None, "finish_reason": finish}],
                "usage": usage(f), "fastdllm": details(f, prepared)}

    def chunker(self, job_id: str, model: str, prepared: Prepared) -> "Chunker":
        return Chunker(self.chat, job_id, model, prepared, int(time.time()))


CHAT, COMPLETION = Shape(chat=True), Shape(chat=False)


def parses_calls(prepared: Prepared) -> bool:
    """The answer may hold tool calls to parse (tools given, tool_choice not 'none')."""
    return prepared.tools is not None and prepared.tools.choice != "none"


def answer_calls(text: str, finish: str, prepared: Prepared) -> tuple[str | None, list[dict], str]:
    """(content, tool_calls, finish_reason) of an answer: its calls parsed where tools were given;
    finish_reason "tool_calls" for a whole answer that holds some."""
    if not parses_calls(prepared):
        return text, [], finish
    content, calls = parse_calls(text, prepared.tools.syntax)
    return content, calls, "tool_calls" if calls and finish == "stop" else finish


@dataclass(frozen=True)
class Chunker:
    """The chunks of one stream: first (the role, and what is decoded), one per text piece or step,
    the last with the finish reason, then the usage when asked."""
    chat: bool
    job_id: str
    model: str
    prepared: Prepared
    created: int

    def _chunk(self, choices: list[dict], **extra) -> dict:
        chunk = {"id": self.job_id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                 "created": self.created, "model": self.model, "choices": choices}
        if self.prepared.include_usage:
            chunk["usage"] = None                   # as OpenAI: null on every chunk but the usage one
        return {**chunk, **extra}

    def _choice(self, text: str | None = None, finish: str | None = None, role: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant"} if role else {}
            body = {"delta": {**delta, "content": text} if text is not None else delta}
        else:
            body = {"text": text or ""}
        return {"index": 0, **body, "logprobs": None, "finish_reason": finish}

    def first(self) -> dict:
        return self._chunk([self._choice("", role=True)], fastdllm=self.prepared.info())

    def step(self, u: StepUpdate) -> dict:
        return self._chunk([self._choice()], fastdllm={"step": {"positions": u.positions, "tokens": u.tokens}})

    def text(self, text: str) -> dict:
        return self._chunk([self._choice(text)])

    def calls(self, calls: list[dict]) -> list[dict]:
        """The tool calls as OpenAI streams them: per call (an index each), a delta with its id, type,
        name and empty arguments, then one with the arguments (sent once the answer is whole: a
        diffusion answer is not final left to right)."""
        def chunk(delta: dict) -> dict:
            return self._chunk([{"index": 0, "delta": {"tool_calls": [delta]}, "logprobs": None, "finish_reason": None}])

        out = []
        for i, c in enumerate(calls):
            out.append(chunk({"index": i, "id": c["id"], "type": c["type"],
                              "function": {"name": c["function"]["name"], "arguments": ""}}))
            out.append(chunk({"index": i, "function": {"arguments": c["function"]["arguments"]}}))
        return out

    def last(self, finish_reason: str) -> dict:
        return self._chunk([self._choice(finish=finish_reason)])

    def usage(self, f: Finished) -> dict:
        return {**self._chunk([]), "usage": usage(f)}


class TrimmedText:
    """Streams an answer so that its pieces join to the answer stripped, as `fastdllm chat` prints it
    for a model without a chat template: leading whitespace dropped, trailing whitespace held back
    until more text follows it."""

    def __init__(self) -> None:
        self.started = False
        self.held = ""

    def feed(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
            self.started = bool(text)
        text = self.held + text
        body = text.rstrip()
        self.held = text[len(body):]
        return body
