"""Tool calls (OpenAI `tools`, `tool_choice`) for chat templates that write one of two call
syntaxes (docs/specs/structured-output.md 7): Qwen's `<tool_call>{json}</tool_call>` (Qwen3, SDAR,
TraDo, Dream, LLaDA2.x) and Gemma-4's `<|tool_call>call:NAME{args}<tool_call|>`. The tools are
rendered by the checkpoint's own template (`apply_chat_template(tools=...)`); with Qwen's syntax
`required` and a named function constrain the answer to one call whose arguments follow the
function's parameter schema (a Lark grammar with the schema inside, decode/constraint.py); `auto`
parses whatever calls the answer holds; `none` parses nothing. Torch-free."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from .errors import ApiError

JSON_FORM = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
QUOTE = '<|"|>'                 # Gemma-4's string delimiter inside a call's arguments


@dataclass(frozen=True)
class Syntax:
    """How a family's template writes a call: `marker` opens one (and names the syntax in the
    template), `call` matches one whole call (groups: the name, where outside the body, and the body)."""
    name: str
    marker: str
    call: re.Pattern
    constrainable: bool          # a grammar for `required` / a named function exists

    def parse(self, m: re.Match) -> tuple[str, Any] | None:
        """(name, arguments) of a matched call, None where its body does not parse."""
        try:
            if self is QWEN:
                call = json.loads(m.group("body"))
                if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                    return None
                return call["name"], call.get("arguments", {})
            return m.group("name"), gemma_arguments(m.group("body"))
        except (json.JSONDecodeError, ValueError):
            return None


QWEN = Syntax("Qwen's <tool_call>", "<tool_call>",
              re.compile(r"<tool_call>\s*(?P<body>\{.*?\})\s*</tool_call>", re.DOTALL), True)
# transformers' response template for gemma4 (cli/serving/utils.py): call:NAME then an object whose
# keys are bare and whose strings are delimited by <|"|>
GEMMA4 = Syntax("Gemma-4's <|tool_call>", "<|tool_call>",
                re.compile(r"<\|tool_call>call:(?P<name>\w+)(?P<body>\{.*?\})<tool_call\|>", re.DOTALL), False)
SYNTAXES = (GEMMA4, QWEN)       # Gemma-4's marker holds Qwen's text: checked first


def gemma_arguments(body: str) -> dict:
    """Gemma-4's arguments `{city:<|"|>Paris<|"|>,days:2}` as a dict: strings re-quoted as JSON,
    bare keys quoted; ValueError when the result is not one JSON object."""
    parts = body.split(QUOTE)
    if len(parts) % 2 == 0:
        raise ValueError("an unclosed string")
    out = []
    for i, part in enumerate(parts):
        if i % 2:                                    # inside a string
            out.append(json.dumps(part))
        else:
            out.append(re.sub(r"([{,]\s*)([A-Za-z_][\w.-]*)(\s*):", r'\1"\2"\3:', part))
    value = json.loads("".join(out))
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value


@dataclass(frozen=True)
class Tools:
    functions: tuple[dict, ...]     # each {"name", "description"?, "parameters"?}
    choice: str                     # "auto" | "none" | "required" | a function's name
    syntax: Syntax = QWEN           # how the template writes a call

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
    syntax = syntax_of(template)
    if syntax is None:
        raise ApiError(400, "tools: this model's chat template does not render tools in a call syntax fastdllm "
                       "parses (Qwen's <tool_call>, Gemma-4's <|tool_call>)", param="tools")
    if choice not in ("auto", "none") and not syntax.constrainable:
        raise ApiError(400, f"tool_choice: {choice!r} needs a grammar for {syntax.name} calls, which fastdllm does "
                       "not have yet (use 'auto': its calls are parsed)", param="tool_choice")
    for i, f in enumerate(functions):              # the arguments' schema the call grammar holds
        if choice in ("required", f["name"]):
            parameters_held(f.get("parameters") or {}, f"tools.{i}.function.parameters")
    return Tools(tuple(functions), choice, syntax)


def parameters_held(schema: dict, param: str) -> None:
    """A 400 naming `param` where the matcher would not hold the schema as written (constraint.held_exactly)."""
    from ..decode.constraint import ConstraintError, held_exactly

    try:
        held_exactly(schema, "JSON Schema")
    except ConstraintError as e:
        raise ApiError(400, f"{param}: {e}", param=param) from None


def syntax_of(template: str | None) -> Syntax | None:
    """The call syntax a chat template renders tools in, None when it renders no tools."""
    if not template or "tools" not in template:
        return None
    return next((s for s in SYNTAXES if s.marker in template), None)


def parse_calls(text: str, syntax: Syntax = QWEN) -> tuple[str | None, list[dict]]:
    """(content left outside the calls or None, OpenAI tool_calls) of an answer: each call in the
    syntax whose body parses; the rest stays content."""
    calls, kept, last = [], [], 0
    for m in syntax.call.finditer(text):
        parsed = syntax.parse(m)
        if parsed is None:
            continue
        name, arguments = parsed
        kept.append(text[last:m.start()])
        last = m.end()
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": name,
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
