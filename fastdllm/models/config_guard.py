"""The config.json switches of a family: what its authors' code (any version) reads to change the
forward or the decoder, and which values fastdllm implements (docs/specs/config-guard.md).

A family's config class lists its `switches` (Switch: key, the values implemented, what another
value turns on, the authors' value when the key is absent), the keys it `reads`, and the keys
that change nothing at inference (`harmless`: metadata, training-only settings). A config.json
that sets a switch to a value fastdllm does not implement is refused before any weight is read, in
one line naming the key and the family; `info` shows the same line as a warning. A key in none of
the three lists is not refused (it may be harmless) but named in a note: fastdllm cannot vouch for
what it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

ABSENT_OK = object()      # Switch.default: the authors' behaviour without the key is what fastdllm implements
REQUIRED = object()       # Switch.default: without the key the authors' engines disagree; refused

# Keys every family's config.json may carry that change nothing at inference.
METADATA = frozenset({"architectures", "model_type", "transformers_version", "auto_map", "torch_dtype", "dtype",
                      "_name_or_path", "use_cache", "initializer_range", "attention_dropout", "output_attentions",
                      "output_hidden_states", "return_dict", "attn_implementation"})


@dataclass(frozen=True)
class Switch:
    key: str                                  # a config.json key; "text_config.x" inside a nested object
    accepts: tuple | Callable[[Any, dict], bool]   # the values implemented, or a test of (value, config)
    meaning: str                              # what another value turns on, in the authors' code
    default: Any = ABSENT_OK                  # what the authors' code uses when the key is absent

    def lookup(self, raw: dict) -> tuple[bool, Any]:
        """(present, value) of this key in a config.json object."""
        node = raw
        *parents, leaf = self.key.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            return False, None
        return True, node[leaf]

    def implemented(self, value: Any, raw: dict) -> bool:
        if callable(self.accepts):
            return bool(self.accepts(value, raw))
        # JSON's true is not 1 here (Python's True == 1 is); 1 and 1.0 are the same number
        return any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in self.accepts)

    def refusal(self, raw: dict, family: str) -> str | None:
        """The one-line reason this config.json cannot be decoded as its authors do, or None."""
        present, value = self.lookup(raw)
        if present:
            if self.implemented(value, raw):
                return None
            return f"config.json sets {self.key}={value!r} ({self.meaning}); fastdllm's {family} does not implement it yet"
        if self.default is ABSENT_OK:
            return None
        if self.default is REQUIRED:
            return f"config.json has no {self.key} ({self.meaning}); fastdllm's {family} will not guess it: add the key"
        if self.implemented(self.default, raw):
            return None
        return (f"config.json has no {self.key}: the authors' code then uses {self.default!r} ({self.meaning}); "
                f"fastdllm's {family} does not implement it yet")


def refusals(raw: dict, config_class, family: str) -> dict[str, str]:
    """key -> the one-line reason, for every switch of `config_class` this config.json sets beyond
    fastdllm (in the class's order)."""
    found = {s.key: s.refusal(raw, family) for s in config_class.switches}
    return {key: line for key, line in found.items() if line}


def refusal_line(found: dict[str, str]) -> str:
    """One line for the user: the first refusal, and the keys of any others."""
    keys = list(found)
    return found[keys[0]] + (f" (also {', '.join(keys[1:])})" if len(keys) > 1 else "")


def unknown_keys(raw: dict, config_class) -> list[str]:
    """config.json keys that are neither read, nor a switch, nor known to be harmless; nested
    objects a family reads (`nested`) are looked into ("text_config.x")."""
    known = set(METADATA) | set(config_class.reads) | set(config_class.harmless) \
        | {s.key for s in config_class.switches}
    found = []
    for prefix in ("", *config_class.nested):
        node = raw.get(prefix, {}) if prefix else raw
        for key in node if isinstance(node, dict) else ():
            name = f"{prefix}.{key}" if prefix else key
            if name not in known and name not in config_class.nested:
                found.append(name)
    return sorted(found)


def number(value, raw) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def any_value(value, raw) -> bool:
    return True
