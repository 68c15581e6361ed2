"""Figures for people: sizes in bytes as B / KB / MB / GB (binary units, one decimal), counts
with their noun in the singular or the plural."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KB'."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """(1, 'token') -> '1 token'; (2, 'token') -> '2 tokens'; `nouns` where adding 's' is wrong."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"
