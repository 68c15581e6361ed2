"""`fastdllm profiles list | show NAME [--resolved]`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml

from fastdllm.checkpoints.locate import resolve_model_dir

from .terminal import out_console as out
from .terminal import print_columns
from .user_errors import user_errors

app = typer.Typer(help="List and inspect decoding profiles.", no_args_is_help=True)


@app.command("list")
@user_errors
def list_profiles():
    """Built-in and user profiles (FASTDLLM_PROFILE_DIR, ~/.config/fastdllm/profiles)."""
    from fastdllm.decode import profiles

    print_columns([(p.name, p.source, p.description) for p in profiles.available()],
                  header=("name", "source", "description"))


@app.command("show")
@user_errors
def show(
    name: Annotated[str, typer.Argument(help="Profile name or YAML file.")],
    resolved: Annotated[bool, typer.Option("--resolved", help="The full settings after every layer.")] = False,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Include this model's defaults.")] = None,
):
    """Show a profile; with --resolved, every setting after defaults, model, profile and environment."""
    from fastdllm.decode import profiles

    profile = profiles.find(name)
    if not resolved:       # a file that -P loads back to the same settings (description included)
        out.print(f"# {profile.name} ({profile.source}: {profile.path})")
        values = ({"description": profile.description} if profile.description else {}) | profile.values
        out.print(as_yaml(values))
        return
    model_dir = resolve_model_dir(model) if model else default_model_dir()
    cfg = profiles.resolve(profile, {}, model_dir)
    against = f"model {model_dir.name}" if model_dir else "no model defaults"
    out.print(f"# {profile.name} resolved for {against} (defaults < model < profile < FASTDLLM_* env < flags)")
    out.print(as_yaml(cfg.to_dict()))


def as_yaml(values: dict) -> str:
    """Block YAML with no line folding: long descriptions stay one line."""
    return yaml.safe_dump(values, sort_keys=False, allow_unicode=True, width=float("inf")).rstrip()


def default_model_dir() -> Path | None:
    """The model `generate` uses without -m (FASTDLLM_MODEL, else the built-in one), if any."""
    from fastdllm.errors import UserError

    try:
        return resolve_model_dir(os.environ.get("FASTDLLM_MODEL"))
    except UserError:                    # no built-in model installed, or a hub id not available here
        return None
