"""Tool calls (OpenAI `tools`, `tool_choice`) for chat templates that write Qwen's `<tool_call>`
syntax (Qwen3, SDAR, TraDo, Dream: docs/structured-output.md 7). The tools are rendered by the
checkpoint's own template (`apply_chat_template(tools=...)`); `required` and a named function
constrain the answer to one call whose arguments follow the function's parameter schema (a Lark
grammar with the schema inside, decode/constraint.py); `auto` parses whatever calls the answer
holds; `none` parses nothing. Torch-free."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from .requests import ApiError

CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
JSON_FORM = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Tools:
    functions: tuple[dict, ...]     # each {"name", "description"?, "parameters"?}
    choice: str                     # "auto" | "none" | "required" | a function's name

    def for_template(self) -> list[dict]:
        return [{"type": "function", "function": f} for f in self.functions]

    def grammar(self, tokenizer) -> str | None:
        """The Lark grammar of one call (`required`, a named function), or None (`auto`, `none`).
        Where the vocabulary holds `<tool_call>` as one token (Qwen's), the grammar names that token
        (`<[id]>`): the library reads added tokens as special, never as their text."""
        if self.choice in ("auto", "none"):
            return None
        chosen = [f for f in self.functions if self.choice == "required" or f["name"] == self.choice]
        calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                  "properties": {"name": {"const": f["name"]},
                                 "arguments": f.get("parameters") or {"type": "object", "properties": {}}}}
                 for f in chosen]
        schema = dict(calls[0] if len(calls) == 1 else {"anyOf": calls}, **{"x-guidance": JSON_FORM})
        return f'start: {marker("<tool_call>", tokenizer)} "\\n" %json {json.dumps(schema)} "\\n" ' \
               f'{marker("</tool_call>", tokenizer)}\n'


def marker(text: str, tokenizer) -> str:
    """A Lark item for `text`: its token as `<[id]>` where it is one token of the vocabulary, else the text."""
    token = tokenizer.convert_tokens_to_ids(text) if tokenizer is not None else None
    if isinstance(token, int) and token != getattr(tokenizer, "unk_token_id", None):
        return f"<[{token}]>"
    return json.dumps(text)


def tools_of(tools: Any, tool_choice: Any, template: str | None) -> Tools | None:
    """The request's Tools, or None when it names none; ApiError (400) naming the field."""
    if tools in (None, []):
        if tool_choice not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice: no tools given", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise ApiError(400, "tools: expected a list", param="tools")
    functions = []
    for i, tool in enumerate(tools):
        f = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise ApiError(400, f"tools.{i}: expected {{'type': 'function', 'function': {{'name': ...}}}}",
                           param=f"tools.{i}")
        if not isinstance(f.get("parameters", {}), dict):
            raise ApiError(400, f"tools.{i}.function.parameters: expected a JSON Schema object",
                           param=f"tools.{i}.function.parameters")
        functions.append({k: f[k] for k in ("name", "description", "parameters") if k in f})
    names = [f["name"] for f in functions]
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, dict):
        named = choice.get("function", {}).get("name") if choice.get("type") == "function" else None
        if named not in names:
            raise ApiError(400, f"tool_choice: expected a function among the tools ({', '.join(names)})",
                           param="tool_choice")
        choice = named
    elif choice not in ("auto", "none", "required"):
        raise ApiError(400, "tool_choice: expected 'auto', 'none', 'required' or a named function", param="tool_choice")
    if not template or "tools" not in template or "<tool_call>" not in template:
        raise ApiError(400, "tools: this model's chat template does not render tools in the <tool_call> syntax",
                       param="tools")
    return Tools(tuple(functions), choice)


def parse_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content left outside the calls or None, OpenAI tool_calls) of an answer: each
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` that parses; the rest stays content."""
    calls, kept, last = [], [], 0
    for m in CALL.finditer(text):
        try:
            call = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        kept.append(text[last:m.start()])
        last = m.end()
        arguments = call.get("arguments", {})
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
    content = ("".join(kept) + text[last:]).strip()
    return (content or None) if calls else text, calls


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as chat templates read them: an assistant's tool_calls with their arguments as
    objects (OpenAI sends JSON text), a tool result's content as text."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": _arguments(c["function"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def _arguments(function: dict) -> Any:
    raw = function.get("arguments", "{}")
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        raise ApiError(400, "messages: a tool call's arguments are not JSON", param="messages") from None
