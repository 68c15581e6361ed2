"""The chat session without terminal or model: its state, the command parser, each slash command,
multi-line input and fitting the history into the context. `fastdllm chat` (cli/chat.py) does the
I/O and the one model call around these pure pieces."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from ..decode import profiles
from ..decode.config import ConfigError, DecodeConfig
from ..errors import UserError
from ..units import plural

MULTILINE = '"""'
ROLES = ("user", "assistant")

HELP = '''Commands:
  /help, /?         this help
  /bye, /exit       leave (Ctrl+D too)
  /clear            forget the conversation (the system prompt stays)
  /regen            answer the last message again, replacing the answer
  /set KEY VALUE    change a decoding setting, e.g. /set threshold 0.8 (/set system TEXT too)
  /profile NAME     switch profile (command-line flags and /set values keep precedence)
  /show             settings, model and conversation
  /stats            session totals
  /save FILE        save the conversation as JSON
  /load FILE        load a conversation saved with /save
  """               start a multi-line message; end it with a line ending in """
Ctrl+C stops an answer (it is discarded, the conversation stays); Ctrl+D exits.'''


@dataclass
class Totals:
    answers: int = 0            # answers completed (regenerations included; /clear keeps them)
    tokens: int = 0
    nfe: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        if not self.answers:
            return "No answers yet."
        return (f"{plural(self.answers, 'answer')} · {plural(self.tokens, 'token')} · {plural(self.nfe, 'forward')} · "
                f"{self.seconds:.2f} s · {self.tokens / max(self.seconds, 1e-9):.1f} tok/s mean")


@dataclass
class Session:
    cfg: DecodeConfig
    profile: profiles.Profile
    flags: dict[str, Any] = field(default_factory=dict)      # decoding flags given on the command line
    model_dir: Path | None = None
    system: str | None = None
    thinking: bool | None = None                              # the template's thinking switch (None: its default)
    messages: list[dict] = field(default_factory=list)       # {"role": "user" | "assistant", "content"}
    overrides: dict[str, Any] = field(default_factory=dict)  # /set values, applied over profile and flags
    model_info: dict = field(default_factory=dict)
    totals: Totals = field(default_factory=Totals)
    regens: int = 0

    def record(self, history: list[dict], message: str, answer: str, result) -> None:
        """A completed answer: `history` is what the prompt kept (older turns may have been dropped)."""
        self.messages = list(history) + [{"role": "user", "content": message},
                                         {"role": "assistant", "content": answer}]
        self.totals.answers += 1
        self.totals.tokens += result.generated_tokens
        self.totals.nfe += result.nfe
        self.totals.seconds += result.seconds_total

    def regen_config(self) -> DecodeConfig:
        """Each /regen decodes with the next seed, so that sampling gives a different answer."""
        self.regens += 1
        return replace(self.cfg, seed=self.cfg.seed + self.regens)


@dataclass(frozen=True)
class Reply:
    text: str = ""                  # for the user (stderr)
    action: str | None = None       # "exit" | "regen" | None


# ---------------------------------------------------------------- input

def is_command(line: str) -> bool:
    return line.startswith("/")


def parse(line: str) -> tuple[str, str]:
    """'/name  some arg ' -> ('name', 'some arg')."""
    parts = line[1:].strip().split(None, 1)
    return (parts[0] if parts else ""), (parts[1].strip() if len(parts) > 1 else "")


def read_message(first: str, more: Callable[[], str]) -> str:
    """The message starting with line `first`; `more()` gives the next line. A first line opening
    with \"\"\" starts a block that the first line ending with \"\"\" closes."""
    if not first.startswith(MULTILINE):
        return first
    lines, line = [], first[len(MULTILINE):]
    while not line.endswith(MULTILINE):
        lines.append(line)
        line = more()
    lines.append(line[:-len(MULTILINE)])
    return "\n".join(lines).strip("\n")       # not the empty rest of the opening and closing lines


# ---------------------------------------------------------------- context

def turn_number(history: list[dict]) -> int:
    """The turn of the conversation that a message after `history` is (1 after /clear; a /regen
    answers its turn again)."""
    return sum(m["role"] == "user" for m in history) + 1


def drop_oldest_turn(history: list[dict]) -> list[dict]:
    """Without the first message and whatever follows it up to the next user message."""
    rest = history[1:]
    while rest and rest[0]["role"] != "user":
        rest = rest[1:]
    return rest


def fit_history(history: list[dict], encode: Callable[[list[dict]], list[int]], gen_len: int,
                context_length: int) -> tuple[list[int], list[dict], int]:
    """Drop the oldest turns until prompt + canvas fits the context; the current message is never
    cut. Returns (prompt ids, kept history, turns dropped)."""
    dropped = 0
    while True:
        ids = encode(history)
        if len(ids) + gen_len <= context_length:
            return ids, history, dropped
        if not history:
            raise UserError(f"message too long: {len(ids)} prompt tokens + gen_len {gen_len} exceed the "
                            f"context of {context_length} tokens (shorten it or /set gen_len)")
        history, dropped = drop_oldest_turn(history), dropped + 1


def regen_target(messages: list[dict]) -> tuple[list[dict], str]:
    """(history before the last user message, that message)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "user":
            return messages[:i], messages[i]["content"]
    raise UserError("nothing to regenerate yet")


# ---------------------------------------------------------------- commands

def run_command(session: Session, line: str) -> Reply:
    name, arg = parse(line)
    handler = COMMANDS.get(name)
    if handler is None:
        raise UserError(f"Unknown command '/{name}'. Type /? for help")
    return handler(session, arg)


def cmd_help(session: Session, arg: str) -> Reply:
    return Reply(HELP)


def cmd_bye(session: Session, arg: str) -> Reply:
    return Reply(action="exit")


def cmd_clear(session: Session, arg: str) -> Reply:
    session.messages = []
    return Reply("Conversation cleared" + (" (system prompt kept)." if session.system else "."))


def cmd_regen(session: Session, arg: str) -> Reply:
    regen_target(session.messages)                    # fails early when there is nothing to redo
    greedy = session.cfg.temperature == 0 and session.cfg.confidence != "random"
    return Reply("(greedy decoding gives the same answer unless settings changed; /set temperature 0.7 to sample)"
                 if greedy else "", action="regen")


def cmd_set(session: Session, arg: str) -> Reply:
    key, _, value = arg.partition(" ")
    value = value.strip()
    if not key or not value:
        keys = ", ".join([f.name for f in fields(DecodeConfig)] + ["system"])
        raise UserError(f"usage: /set KEY VALUE (keys: {keys})")
    if key == "system":
        session.system = value
        return Reply("System prompt set.")
    cfg = DecodeConfig.from_dict({key: value}, session.cfg)   # ConfigError leaves the session as it was
    name = key.replace("-", "_")
    session.cfg, session.overrides[name] = cfg, getattr(cfg, name)
    return Reply(f"{name} = {getattr(cfg, name)}")


def cmd_profile(session: Session, arg: str) -> Reply:
    if not arg:
        names = ", ".join(p.name for p in profiles.available())
        return Reply(f"Profile {session.profile.name} (available: {names})")
    profile = profiles.find(arg)
    cfg = profiles.resolve(profile, session.flags, session.model_dir)   # flags > env > profile
    try:
        cfg = DecodeConfig.from_dict(session.overrides, cfg)             # /set values on top
    except ConfigError as e:
        raise UserError(f"profile {profile.name} with your /set values: {e}") from None
    session.profile, session.cfg = profile, cfg
    kept = sorted(set(session.flags) | set(session.overrides))
    return Reply(f"Profile {profile.name}" + (f" (kept: {', '.join(kept)})" if kept else "") + ".")


def cmd_show(session: Session, arg: str) -> Reply:
    def source(name):
        return " (/set)" if name in session.overrides else " (flag)" if name in session.flags else ""
    info = session.model_info
    lines = [f"profile: {session.profile.name}"]
    lines += [f"  {k}: {v}{source(k)}" for k, v in session.cfg.to_dict().items()]
    lines += [f"model: {info.get('path', '?')}"]
    lines += [f"  {k}: {info[k]}" for k in ("family", "parameters", "dtype", "device", "context_length",
                                             "chat_template") if k in info]
    lines += [f"system: {session.system!r}" if session.system else "system: none",
              f"conversation: {plural(len(session.messages), 'message')}"]
    return Reply("\n".join(lines))


def cmd_stats(session: Session, arg: str) -> Reply:
    return Reply(session.totals.describe())


def cmd_save(session: Session, arg: str) -> Reply:
    if not arg:
        raise UserError("usage: /save FILE")
    path = Path(arg).expanduser()
    data = {"system": session.system, "messages": session.messages}
    try:
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None
    return Reply(f"Saved {plural(len(session.messages), 'message')} to {path}.")


def cmd_load(session: Session, arg: str) -> Reply:
    if not arg:
        raise UserError("usage: /load FILE")
    path = Path(arg).expanduser()
    session.system, session.messages = load_history(path)
    return Reply(f"Loaded {plural(len(session.messages), 'message')} from {path}.")


def load_history(path: Path) -> tuple[str | None, list[dict]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a text file") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON (line {e.lineno}: {e.msg})") from None
    shape = f'{path}: expected {{"system": TEXT or null, "messages": [{{"role": ..., "content": ...}}, ...]}}'
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise UserError(shape)
    system = data.get("system")
    if system is not None and not isinstance(system, str):
        raise UserError(shape)
    for i, m in enumerate(data["messages"], 1):
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise UserError(f"{path}: message {i} needs a role (user or assistant) and a text content")
    return system or None, [{"role": m["role"], "content": m["content"]} for m in data["messages"]]


COMMANDS: dict[str, Callable[[Session, str], Reply]] = {
    "help": cmd_help, "?": cmd_help, "bye": cmd_bye, "exit": cmd_bye, "clear": cmd_clear,
    "regen": cmd_regen, "set": cmd_set, "profile": cmd_profile, "show": cmd_show, "stats": cmd_stats,
    "save": cmd_save, "load": cmd_load,
}
