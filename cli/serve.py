"""`fastdllm serve`: the OpenAI-compatible HTTP server (fastdllm/serve/). This file parses flags,
binds the port, loads the model, starts the scheduler and runs uvicorn until SIGTERM or Ctrl+C."""

from __future__ import annotations

import ipaddress
import signal
import socket
import sys
from contextlib import contextmanager
from typing import Annotated, Optional

import typer

from fastdllm.errors import UsageError, UserError

from .model import prepare
from .options import TENSOR_PARALLEL, RunOptions, generation_options
from .user_errors import user_errors

EXAMPLES = """Examples:

  fastdllm serve --profile code --port 8000

  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' -d '{"model": "tiny-code", "messages": [{"role": "user", "content": "def fibonacci(n):"}], "max_tokens": 64}'

  python -c 'from openai import OpenAI; c = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none"); print(c.completions.create(model="tiny-code", prompt="def add(a, b):", max_tokens=32).choices[0].text)'

Requests may add a "fastdllm" object: {"profile": "fast", "threshold": 0.8, "steps": true} (steps true streams each step's commits; an integer is --steps)."""


@user_errors
@generation_options
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on; one that is not loopback needs --api-key (or --insecure).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free port).")] = 8000,
    max_batch: Annotated[int, typer.Option("--max-batch", min=1, help="Most requests decoded together in one batch.")] = 8,
    max_queue: Annotated[int, typer.Option("--max-queue", min=1, help="Most requests waiting for the batch; more are refused (429).")] = 64,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="FASTDLLM_API_KEY", show_envvar=True, help="Require 'Authorization: Bearer KEY' on every endpoint but /health.")] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="Allow a non-loopback --host without an API key.")] = False,
    shutdown_timeout: Annotated[float, typer.Option("--shutdown-timeout", min=0, help="On SIGTERM or Ctrl+C, seconds the running and queued requests may take to finish; then each running one is answered with what it has (finish_reason 'abort'), each queued one with 503.")] = 5.0,
    tp: Annotated[Optional[int], TENSOR_PARALLEL] = None,
    *, opts: RunOptions,
):
    """Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions,
    /v1/models, /health, /metrics) and ollama's (/api/chat, /api/generate, /api/tags, /api/show,
    /api/ps, /api/version), batching concurrent requests. The decoding flags set the server's defaults."""
    api_key = api_key or None
    if api_key is None and not insecure and not is_loopback(host):
        raise UsageError(f"--host {host} is reachable from other machines: set --api-key (or FASTDLLM_API_KEY), "
                         "or pass --insecure")
    from . import parallel

    world, ranks = parallel.split_run(tp, opts, signal_stops=True)   # --tp N: rank 0 serves, the others follow
    if world is not None and not world.first:
        from fastdllm.serve.followers import follow

        lm = prepare(opts, ranks)[0]
        return follow(world, lm.decoder, lm.tokenizer)
    sock = listen(host, port)                      # before loading: a busy port fails in a second
    try:
        run(sock, host, opts, max_batch=max_batch, max_queue=max_queue, api_key=api_key,
            shutdown_timeout=shutdown_timeout, world=world, ranks=ranks)
    finally:
        sock.close()


def run(sock: socket.socket, host: str, opts: RunOptions, *, max_batch: int, max_queue: int,
        api_key: str | None, shutdown_timeout: float = 5.0, world=None, ranks=None) -> None:
    try:
        import uvicorn

        from fastdllm.serve.app import create_app
        from fastdllm.serve.shutdown import GracefulServer
    except ImportError as e:
        raise UserError(f"fastdllm serve needs {e.name}: pip install 'fastdllm[serve]'") from None
    from fastdllm.serve.metrics import Metrics
    from fastdllm.serve.scheduler import Scheduler

    from fastdllm.serve.followers import Leader

    lm, profile, cfg = prepare(opts, ranks)
    metrics = Metrics()
    scheduler = Scheduler(lm.decoder, max_batch=max_batch, max_queue=max_queue, metrics=metrics,
                          leader=Leader(world) if world is not None else None)
    scheduler.start()
    server = None
    try:
        app = create_app(lm, scheduler, base_cfg=cfg, profile_name=profile.name, api_key=api_key, metrics=metrics,
                         cli_flags={k: v for k, v in opts.decode.items() if v is not None}, name=served_name(opts.model))
        server = GracefulServer(uvicorn.Config(app, host=host, port=sock.getsockname()[1], log_level="warning",
                                               access_log=False), scheduler, shutdown_timeout)
        shown = f"[{host}]" if ":" in host else host
        sys.stderr.write(f"fastdllm serve: http://{shown}:{sock.getsockname()[1]}/v1 "
                         f"(model {lm.path.name}, profile {profile.name})\n")
        sys.stderr.flush()
        with signals_handled_by_uvicorn():
            server.run(sockets=[sock])
        sys.stderr.write("fastdllm serve: stopped\n")
    finally:
        # uvicorn waited for the running requests; after a second Ctrl+C (force exit) nobody waits
        scheduler.shutdown(timeout=0 if server is not None and server.force_exit else None)


def served_name(spec: str | None) -> str | None:
    """The name clients ask for: a catalog name or hub id as given (a hub snapshot's folder is a
    commit hash); a directory keeps its folder's name."""
    from pathlib import Path

    if spec is None or Path(spec).expanduser().exists():
        return None
    return spec


@contextmanager
def signals_handled_by_uvicorn():
    """uvicorn catches SIGINT/SIGTERM, stops accepting, lets running requests finish, then raises
    the signal again for the handler it found installed; a do-nothing handler here turns that into
    a clean return (exit 0) instead of a kill or a KeyboardInterrupt."""
    handled = (signal.SIGINT, signal.SIGTERM)
    saved = {sig: signal.signal(sig, lambda *_: None) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def is_loopback(host: str) -> bool:
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        return False
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket for uvicorn; connections made before it serves wait in the backlog."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as e:
        raise UserError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock
