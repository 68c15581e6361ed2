"""One decoding setting's value: its type read from the dataclass field's annotation, a raw value
(YAML, a flag, an environment variable, the chat REPL's /set) coerced to it, and its own range and
choices checked (the field's metadata). Cross-field rules live in config.py's DecodeConfig."""

from __future__ import annotations

import math
from typing import Any

from ..errors import UsageError


class ConfigError(UsageError, ValueError):
    """A user-facing configuration mistake; the message is one line and names the key."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_NONE = {"", "none", "null", "off"}


def type_of(f) -> tuple[str, bool]:
    """('int' | 'float' | 'bool' | 'str', optional?) from the annotation string."""
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    return kind.replace(" | None", ""), "None" in kind


def parse_value(f, raw: Any) -> Any:
    """Coerce `raw` (YAML value or string from a flag / env / REPL) to the field's type."""
    base, optional = type_of(f)
    if raw is None or (optional and isinstance(raw, str) and raw.strip().lower() in _NONE):
        if optional:
            return None
        raise ConfigError(f"{f.name}: a value is required")
    try:
        if base == "bool":
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
            raise ValueError
        if base == "int":
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(str(raw).strip()) if isinstance(raw, str) else int(raw)
        if base == "float":
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)          # nan / inf are refused by check_field
        return str(raw).strip()
    except (TypeError, ValueError):
        raise ConfigError(f"{f.name}: expected {base}, got {raw!r}") from None


def check_field(f, value: Any) -> None:
    meta = f.metadata
    if value is None:
        return
    base, _ = type_of(f)
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "bool": isinstance(value, bool), "str": isinstance(value, str)}[base]
    if not ok:
        raise ConfigError(f"{f.name}: expected {base}, got {value!r}")
    if base == "float" and not math.isfinite(value):
        raise ConfigError(f"{f.name}: expected a finite number, got {value!r}")
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(f"{f.name}: '{value}' is not one of {', '.join(meta['choices'])}")
    if "min" in meta and value < meta["min"]:
        raise ConfigError(f"{f.name}: {value} is below the minimum {meta['min']}")
    if "gt" in meta and value <= meta["gt"]:
        raise ConfigError(f"{f.name}: {value} must be greater than {meta['gt']}")
    if "max" in meta and value > meta["max"]:
        raise ConfigError(f"{f.name}: {value} is above the maximum {meta['max']}")
