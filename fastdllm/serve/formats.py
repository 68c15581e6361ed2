"""Structured output in requests (docs/specs/structured-output.md): OpenAI's `response_format`
(`json_object`; `json_schema` with `json_schema.schema`, `strict`) and fastdllm's extension
(`"fastdllm": {"regex": ...}` or `{"grammar": ...}`, a Lark grammar), checked against the model's
tokenizer. A bad one is a 400 naming the field, with the library's one line."""

from __future__ import annotations

import json
from typing import Any

from .errors import ApiError

EXTENSION_KEYS = ("regex", "grammar")


def spec_of(response_format: Any, extension: dict | None):
    """(Spec or None, the param it came from). Only one way to ask at a time."""
    from ..decode.constraint import ConstraintError, Spec, held_exactly

    asked = [k for k in EXTENSION_KEYS if (extension or {}).get(k) is not None]
    rf = None if response_format in (None, {"type": "text"}) else response_format
    if len(asked) + (rf is not None) > 1:
        raise ApiError(400, "response_format, fastdllm.regex and fastdllm.grammar: give one of them",
                       param="response_format")
    if asked:
        key = asked[0]
        value = extension[key]
        if not isinstance(value, str) or not value:
            raise ApiError(400, f"fastdllm.{key}: expected a non-empty string", param=f"fastdllm.{key}")
        return Spec(key, value), f"fastdllm.{key}"
    if rf is None:
        return None, None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "json_object":
        return Spec("json"), "response_format"
    if kind == "json_schema":
        inner = rf.get("json_schema")
        if not isinstance(inner, dict) or not isinstance(inner.get("schema"), dict):
            raise ApiError(400, "response_format.json_schema.schema: expected a JSON Schema object",
                           param="response_format.json_schema.schema")
        if not isinstance(inner.get("strict", False), (bool, type(None))):
            raise ApiError(400, "response_format.json_schema.strict: expected a boolean",
                           param="response_format.json_schema.strict")
        param = "response_format.json_schema.schema"
        try:
            held_exactly(inner["schema"])          # before json.dumps: it recurses, a schema may nest thousands deep
        except ConstraintError as e:
            raise ApiError(400, f"{param}: {e}", param=param) from None
        return Spec("json_schema", json.dumps(inner["schema"])), param
    raise ApiError(400, f"response_format.type: {kind!r} is not one of 'text', 'json_object', 'json_schema'",
                   param="response_format.type")


def constraint_of(response_format: Any, extension: dict | None, server, stop: tuple[str, ...]):
    """The request's compiled constraint (decode.constraint.Compiled) or None."""
    from ..decode.constraint import Compiled, ConstraintError
    from ..errors import UserError

    spec, param = spec_of(response_format, extension)
    if spec is None:
        return None
    if stop:
        raise ApiError(400, f"stop: not combined with {param} (a stop string would cut the answer's sentence)",
                       param="stop")
    sampler = server.lm.model.sampler
    if sampler == "renoise":
        raise ApiError(400, f"{param}: {server.model_name} rewrites every position every step, so no prefix "
                            f"stays for a grammar to check", param=param)
    if sampler == "seeded":                    # decode/seeded.py refuses it too, once the job is decoded
        raise ApiError(400, f"{param}: {server.model_name}'s seeded block decoder has no structured output yet",
                       param=param)
    try:
        return Compiled(spec, server.lm.tokenizer)
    except ConstraintError as e:
        raise ApiError(400, f"{param}: {e}", param=param) from None
    except UserError as e:                     # llguidance missing: a 400 (a 5xx would be retried) naming it
        raise ApiError(400, f"{param}: {e}", param=param, code="structured_output_unavailable") from None
