"""The structured-output flags of `generate` and `chat` (docs/specs/structured-output.md), declared once:
--json-schema FILE, --regex PATTERN, --grammar FILE; at most one. A bad one exits 2 with one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from fastdllm.errors import UsageError, UserError
from fastdllm.units import plural

CONSTRAINT_FLAGS = {
    "json_schema": (Optional[Path], typer.Option("--json-schema", help="Answer with JSON valid under this JSON Schema file ('{}' or {\"type\": \"object\"}: any object).", rich_help_panel="Structured output")),
    "regex": (Optional[str], typer.Option("--regex", help="Answer with text that matches this regular expression (whole answer).", rich_help_panel="Structured output")),
    "grammar": (Optional[Path], typer.Option("--grammar", help="Answer with a sentence of this Lark grammar file (llguidance's Lark; start rule 'start').", rich_help_panel="Structured output")),
}


def spec_from(json_schema: Path | None, regex: str | None, grammar: Path | None):
    """The Spec the flags ask for, or None; UsageError (exit 2) for two at once or an unreadable file."""
    from fastdllm.decode.constraint import Spec

    given = [(k, v) for k, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar)) if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise UsageError("--json-schema, --regex and --grammar: give one of them")
    kind, value = given[0]
    if kind == "regex":
        return Spec("regex", value)
    try:
        text = Path(value).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--{kind.replace('_', '-')} {value}: cannot read it ({type(e).__name__})") from None
    return Spec(kind, text)


def compile_for(spec, lm) -> Any:
    """The Spec checked against the model's tokenizer (fastdllm.decode.constraint.Compiled), or None."""
    if spec is None:
        return None
    from fastdllm.decode.constraint import Compiled

    return Compiled(spec, lm.tokenizer)


def finish_note(result) -> str | None:
    """A line for stderr when the constrained answer did not complete within its length; a
    UserError (one line, exit 1) when its grammar matcher failed, which ended the answer early."""
    if result.constraint_errors and result.constraint_errors[0] is not None:
        raise UserError(f"structured output: the grammar matcher failed after {plural(len(result.ids[0]), 'token')} "
                        f"of the answer ({result.constraint_errors[0]}); a simpler constraint may fit its limits")
    if result.complete and result.complete[0] is False:
        return (f"finish: length (the answer ended after {plural(len(result.ids[0]), 'token')}, before its constraint was "
                f"complete; raise -n)")
    return None
