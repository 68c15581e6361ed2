"""`fastdllm profiles list | show NAME [--resolved]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml
from rich.console import Console
from rich.table import Table

from .common import resolve_model_dir, user_errors

app = typer.Typer(help="List and inspect decoding profiles.", no_args_is_help=True)
out = Console(highlight=False)


@app.command("list")
@user_errors
def list_profiles():
    """Built-in and user profiles (FASTDLLM_PROFILE_DIR, ~/.config/fastdllm/profiles)."""
    from fastdllm import profiles

    table = Table(box=None, pad_edge=False)
    for column in ("name", "source", "description"):
        table.add_column(column, overflow="fold")
    for p in profiles.available():
        table.add_row(p.name, p.source, p.description)
    out.print(table)


@app.command("show")
@user_errors
def show(
    name: Annotated[str, typer.Argument(help="Profile name or YAML file.")],
    resolved: Annotated[bool, typer.Option("--resolved", help="The full settings after every layer.")] = False,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Include this model's defaults.")] = None,
):
    """Show a profile; with --resolved, every setting after defaults, model, profile and environment."""
    from fastdllm import profiles

    profile = profiles.find(name)
    if not resolved:
        out.print(f"# {profile.name} ({profile.source}: {profile.path})")
        if profile.description:
            out.print(f"# {profile.description}")
        out.print(yaml.safe_dump(profile.values, sort_keys=False).rstrip())
        return
    model_dir: Path | None = resolve_model_dir(model) if model else None
    cfg = profiles.resolve(profile, {}, model_dir)
    out.print(f"# {profile.name} resolved (defaults < model < profile < FASTDLLM_* env < flags)")
    out.print(yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip())
