"""The one-line refusal check the accelerator tests share: `fn` raises `error` (a UserError or
ConfigError) whose message holds `message` and no line break."""

from __future__ import annotations

import pytest


def one_line_refusal(fn, message: str, error: type[Exception] | None = None) -> None:
    from fastdllm.errors import UserError

    with pytest.raises(error or UserError) as raised:
        fn()
    assert message in str(raised.value) and "\n" not in str(raised.value)
