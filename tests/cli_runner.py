"""The one way tests run the CLI in process: typer's runner on fastdllm's app, arguments as strings,
exceptions not caught (a traceback fails the test instead of hiding in the result)."""

from __future__ import annotations

from typer.testing import CliRunner

from fastdllm.cli.app import app


def invoke(*args, input=None, env=None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input, env=env, catch_exceptions=False)
