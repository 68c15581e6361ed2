"""`fastdllm chat`: a multi-turn REPL. The session state and the slash commands are pure functions in
fastdllm/terminal/chat.py; this file reads input, prints, and makes the one model call (`answer`)."""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Optional

import typer

from fastdllm.decode.rules import describe
from fastdllm.errors import UserError

from .constraint_flags import CONSTRAINT_FLAGS, compile_for, finish_note, spec_from
from .model import prepare
from .options import RunOptions, generation_options
from .terminal import err_console, is_terminal, keys_not_echoed, live_view
from .text_input import utf8
from .user_errors import user_errors

PROMPT, MORE = ">>> ", "... "


def say(text: str, style: str | None = None) -> None:
    """Everything but the answers goes to stderr (as plain text, one line kept on one line)."""
    err_console.print(text, style=style)


@user_errors
@generation_options
def chat(
    system: Annotated[Optional[str], typer.Option("--system", help="System prompt for the conversation.")] = None,
    think: Annotated[Optional[bool], typer.Option("--think/--no-think", help="The chat template's thinking mode, where it has one (Gemma-4: enable_thinking; default: the template's, off); thoughts are not shown.")] = None,
    json_schema: Annotated[Optional[Path], CONSTRAINT_FLAGS["json_schema"][1]] = None,
    regex: Annotated[Optional[str], CONSTRAINT_FLAGS["regex"][1]] = None,
    grammar: Annotated[Optional[Path], CONSTRAINT_FLAGS["grammar"][1]] = None,
    *, opts: RunOptions,
):
    """Chat with a model, turn by turn (/? lists the commands; piped lines are messages, for scripts)."""
    from fastdllm.terminal.chat import Session, is_command, read_message

    spec = spec_from(json_schema, regex, grammar)
    lm, profile, cfg = prepare(opts)
    constraint = compile_for(spec, lm)             # every answer of the session follows it
    if think is not None and not lm.has_chat_template:
        raise UserError(f"--think/--no-think switch the chat template's thinking: {lm.path.name} has no chat template")
    if not lm.has_chat_template and (why := lm.model.plain_chat_refusal):
        raise UserError(why)                       # no plain transcript for a family that needs its template
    session = Session(cfg, profile, flags={k: v for k, v in opts.decode.items() if v is not None},
                      model_dir=lm.path, system=system, model_info=lm.info, thinking=think)
    interactive = is_terminal(sys.stdin)
    live = interactive and is_terminal(sys.stdout) and err_console.is_terminal
    if interactive:
        say(f"{lm.path.name} · profile {profile.name} · {lm.info['device']} {lm.info['dtype']} · "
            f"{describe(cfg)}\nType a message; /? for help, /bye or Ctrl+D to exit.", "bold")
    if not lm.has_chat_template:
        say(f"note: {lm.path.name} has no chat template; using a plain 'User: / Assistant:' transcript", "yellow")
    read = terminal_reader() if interactive else pipe_reader

    while True:
        try:
            line = read(PROMPT)
            command = is_command(line)                     # a """ block starting with / is a message
            text = line if command else read_message(line, lambda: read(MORE))
        except EOFError:                                   # Ctrl+D or end of piped input
            if interactive:
                say("")
            return
        except KeyboardInterrupt:                          # at the prompt: the session goes on
            say("\nUse /bye or Ctrl+D to exit", "yellow")
            continue
        except UserError as e:                             # an undecodable line: said, skipped
            say(str(e), "red")
            continue
        try:
            if text.strip() and not handle(lm, session, text, command, live, constraint):
                return
        except UserError as e:                             # one line; nothing in the session changed
            say(str(e), "red")
        except KeyboardInterrupt:                          # during an answer: drop it, keep the session
            say("stopped: answer discarded, conversation unchanged", "yellow")


def handle(lm, session, text: str, command: bool, live: bool, constraint=None) -> bool:
    """One input, a message or a slash command; False when the session ends."""
    from fastdllm.terminal.chat import regen_target, run_command

    if not command:
        answer(lm, session, session.messages, text, session.cfg, live, constraint)
        return True
    reply = run_command(session, text)
    if reply.text:
        say(reply.text)
    if reply.action == "regen":
        history, message = regen_target(session.messages)
        answer(lm, session, history, message, session.regen_config(), live, constraint)
    return reply.action != "exit"


def answer(lm, session, history: list[dict], message: str, cfg, live: bool, constraint=None) -> None:
    """Decode an answer to `message` after `history` (under `constraint`, constraint.Compiled, if
    given); print it; record the turn in `session`."""
    from fastdllm.checkpoints.plain_chat import cut_plain_answer, plain_transcript
    from fastdllm.decode.engine import run
    from fastdllm.terminal.chat import fit_history, turn_number
    from fastdllm.terminal.stats import stats_line

    if lm.has_chat_template:
        encode = lambda h: lm.encode(message, chat=True, system=session.system, history=h,   # noqa: E731
                                   thinking=session.thinking)
    else:
        encode = lambda h: lm.encode(plain_transcript(session.system, h, message), chat=False)   # noqa: E731
    turn = turn_number(history)                    # of the conversation (what /clear starts again)
    ids, history, dropped = fit_history(history, encode, cfg.gen_len, lm.context_length)
    if dropped:
        say(f"(dropped the {dropped} oldest turn{'s' * (dropped > 1)} to fit the context of "
            f"{lm.context_length} tokens)", "yellow")
    header = f"{lm.path.name} · turn {turn} · cache {cfg.cache} · {describe(cfg)}"
    view = live_view(lm, ids, cfg, header, constrained=constraint is not None) if live else None
    with view or nullcontext(), keys_not_echoed():
        result = run(lm.decoder, [ids], cfg, on_event=view.update if view else None,
                     constraints=[constraint] if constraint else None)
    text = result.texts[0] if lm.has_chat_template or constraint else cut_plain_answer(result.texts[0])
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    if note := finish_note(result):
        say(note, "yellow")
    say(stats_line(result), "dim")
    session.record(history, message, text, result)


def pipe_reader(prompt: str) -> str:
    """Lines from a pipe or file: no prompt, no line editing; each must be valid UTF-8."""
    stream = getattr(sys.stdin, "buffer", None)
    line = stream.readline() if stream else sys.stdin.readline().encode()
    if not line:
        raise EOFError
    return utf8(line, "this input line").rstrip("\r\n")


def terminal_reader():
    try:
        # stdlib readline gives input() line editing and arrow-key history with no new dependency
        # (prompt_toolkit would be one); imported only for a terminal, as it may write escape codes.
        import readline  # noqa: F401
    except ImportError:                                    # not built on every platform; input() still works
        pass
    to_stdout = is_terminal(sys.stdout)

    def read(prompt: str) -> str:
        if not to_stdout:                                  # stdout is a pipe: keep the prompt off it
            sys.stderr.write(prompt)
            sys.stderr.flush()
        try:
            return input(prompt if to_stdout else "")
        except UnicodeDecodeError as e:                   # re-decoded to raise our one-line error
            return utf8(bytes(e.object), "this input line")
    return read
