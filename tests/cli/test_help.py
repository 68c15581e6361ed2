"""What `fastdllm --help` and every command's --help say, and the one output convention: -o/--output
names the file and --format the format in every command; the old spellings (bench's and eval's
`-o FORMAT`, analyze's `-O FILE`) still work for one release, with a note."""

from __future__ import annotations

import pytest
import typer
from cli_runner import invoke

from fastdllm.checkpoints import catalog
from fastdllm.models import registry
from fastdllm.cli.app import FAMILIES, app

WIDE = {"COLUMNS": "2000", "TERMINAL_WIDTH": "2000"}      # no wrapping: a line break is the text's own


def commands() -> dict:
    group = typer.main.get_command(app)
    found = {}
    for name, command in group.commands.items():
        subs = getattr(command, "commands", None)
        found.update({f"{name} {s}": c for s, c in subs.items()} if subs else {name: command})
    return found


def test_help_names_every_family_of_the_catalog():
    """The names come from each family module's NAMES (models/registry.py): a new family names itself."""
    families = {entry.family for entry in catalog.entries().values()}
    unnamed = {f for f in families if not registry.names_of(f)}
    assert not unnamed, f"declare NAMES in the family module of {unnamed}"
    text = " ".join(invoke("--help", env=WIDE).stdout.split())
    assert f"({FAMILIES};" in text and all(registry.names_of(f)[0] in FAMILIES for f in families)
    assert {"LLaDA", "Dream", "SDAR", "LLaDA2.x", "RND1", "DiffusionGemma", "iLLaDA"} <= set(FAMILIES.split(", "))


def test_version():
    r = invoke("--version")
    assert r.exit_code == 0 and r.stdout.startswith("fastdllm ") and len(r.stdout.splitlines()) == 1


@pytest.mark.parametrize("name", ["", *commands()])
def test_help_shows_no_bool_and_breaks_no_sentence(name):
    r = invoke(*name.split(), "--help", env=WIDE)
    assert r.exit_code == 0, r.output
    assert "<bool>" not in r.stdout
    # at 2000 columns each command's summary and this command's description are one line each
    lines = [line.strip(" │") for line in r.stdout.splitlines()]
    listed = {c: next(i for i, line in enumerate(lines) if line.startswith(f"{c.split()[-1]} ")) for c in commands()
              if not name and " " not in c}
    for c, i in listed.items():
        assert lines[i + 1] == "" or lines[i + 1].split()[0] in {x.split()[0] for x in commands()} | {"profiles"}, c
    if name:
        start = next(i for i, line in enumerate(lines) if line.startswith("Usage:"))
        assert lines[start + 1] == "" and lines[start + 2] and lines[start + 3] == "", lines[start:start + 4]


def test_one_output_convention():
    """-o is --output (a file) wherever it exists; formats are --format; nothing else uses -o/-O."""
    for name, command in commands().items():
        options = {tuple(p.opts): p for p in command.params if p.param_type_name == "option"}
        for opts in options:
            assert ("-o" in opts) == ("--output" in opts), (name, opts)
            assert "-O" not in opts or name == "analyze", (name, opts)    # analyze's hidden -O, until the next release
        formats = [o for o in options if "--format" in o]
        assert all(o == ("--format",) for o in formats), (name, formats)


@pytest.mark.parametrize("args, stop", [
    (["bench", "-o", "md", "-r", "0"], "--repetitions 0"),
    (["eval", "--tasks", "x", "-o", "md", "--limit", "0"], "--limit 0"),
])
def test_old_o_format_still_picks_the_format_with_a_note(args, stop):
    r = invoke(*args)
    assert r.exit_code == 2 and stop in r.stderr
    assert "note: -o md is read as --format md for this release only" in " ".join(r.stderr.split())


@pytest.mark.parametrize("command", ["bench", "eval"])
def test_o_names_a_file(command, tmp_path):
    r = invoke(command, *(["--tasks", "x"] if command == "eval" else []), "-o", tmp_path / "results")
    assert r.exit_code == 2 and "cannot tell the format of" in r.stderr and "pass --format" in r.stderr
    r = invoke(command, *(["--tasks", "x"] if command == "eval" else []), "--format", "xml")
    assert r.exit_code == 2 and "--format xml: expected one of" in r.stderr


def test_analyze_o_and_the_old_capital_o(tmp_path):
    r = invoke("analyze", "-O", tmp_path / "a.html", "--prompt-set", "infill")    # refused before loading
    assert "note: -O is -o now" in r.stderr and "the infill set fills holes" in r.stderr
    r = invoke("analyze", "-o", tmp_path / "a.html", "--prompt-set", "infill")
    assert r.exit_code == 2 and "note:" not in r.stderr
