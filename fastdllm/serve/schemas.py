"""The OpenAI request bodies (/v1/chat/completions, /v1/completions) as pydantic models, the fields
accepted only at their "off" value or refused by name, and reading a body: JSON (parse_body), then
one of the models (validated), every mistake an ApiError naming the field. protocol.py turns a
validated request into a Prepared (server.py)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import ApiError


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")      # OpenAI clients send many fields we do not use


class StreamOptions(Lenient):
    include_usage: bool = False


class Message(Lenient):
    role: Literal["system", "user", "assistant", "tool"]
    content: Any = None                             # a string or a list of text parts (checked below)
    tool_calls: Any = None                          # an assistant's calls (serve/tools.py)
    tool_call_id: str | None = None                 # a tool result's call


class CommonRequest(Lenient):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    stop: Any = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    fastdllm: dict[str, Any] | None = None
    # accepted only at the value that means "off": anything else would be silently ignored
    top_p: Any = None
    logprobs: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None


class ChatRequest(CommonRequest):
    messages: list[Message]
    max_completion_tokens: int | None = None
    top_logprobs: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None


class CompletionRequest(CommonRequest):
    prompt: Any = None
    suffix: Any = None
    echo: Any = None
    best_of: Any = None
    response_format: Any = None                     # structured output, as in chat (OpenAI's has none)


# field -> the values that mean the feature is off
OFF_VALUES = {"top_p": (None, 1), "logprobs": (None, False), "top_logprobs": (None, 0),
              "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "logit_bias": (None, {}),
              "echo": (None, False),
              "best_of": (None, 1)}


# structured fields that another API takes and fastdllm does not (chat: OpenAI's legacy functions;
# both: vLLM's guided decoding): refused by name with what to send instead, never ignored (an
# ignored one answers unconstrained text)
NOT_TAKEN = {"functions": "send tools", "function_call": "send tool_choice",
             "guided_json": "send response_format json_schema", "guided_regex": "send fastdllm.regex",
             "guided_grammar": "send fastdllm.grammar (a Lark grammar)",
             "guided_choice": "send fastdllm.regex with the choices as alternatives",
             "structured_outputs": "send response_format, fastdllm.regex or fastdllm.grammar"}
CHAT_ONLY = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")


def parse_body(raw: bytes) -> Any:
    """A request body as JSON; a 400 for what does not parse, nests past Python's recursion limit, or
    holds an integer of more digits than Python converts (never a 500)."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})") from None
    except RecursionError:
        raise ApiError(400, "the request body nests too deeply to be read") from None
    except ValueError as e:                     # "Exceeds the limit (4300 digits) for integer string conversion"
        raise ApiError(400, f"the request body is not read: {str(e).splitlines()[0]}") from None


def validated(model: type[BaseModel], body: Any) -> Any:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        message, param = one_line(e.errors()[0])
        raise ApiError(400, message, param=param) from None


def one_line(error: dict) -> tuple[str, str | None]:
    """(message, param) from a pydantic or FastAPI validation error, without the body prefix."""
    loc = [str(x) for x in error.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    return (f"{param}: {error['msg']}" if param else error["msg"]), param
