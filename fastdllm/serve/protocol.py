"""OpenAI requests (schemas.py: their shapes) converted into what the scheduler decodes: prompt
ids, a DecodeConfig validated by the CLI's own code, stop strings. Every mistake becomes an
ApiError: an HTTP status and one line naming the field."""

from __future__ import annotations

from typing import Any

from ..checkpoints.plain_chat import plain_transcript
from ..decode import profiles
from ..decode.canvas import block_end, fits, length
from ..decode.config import DecodeConfig
from ..errors import UserError
from .errors import ApiError
from .formats import EXTENSION_KEYS, constraint_of
from .schemas import CHAT_ONLY, NOT_TAKEN, OFF_VALUES, ChatRequest, CommonRequest, CompletionRequest, validated
from .server import Prepared, Server
from .tools import template_messages, tools_of

PLAIN_TURN = "\nUser:"      # without a chat template the answer ends where the next user line starts


def prepare_chat(body: Any, server: Server) -> Prepared:
    req = validated(ChatRequest, body)
    refuse_not_taken(body, chat=True)
    messages = [message_of(m, i) for i, m in enumerate(req.messages)]
    if not messages:
        raise ApiError(400, "messages: at least one message is required", param="messages")
    lm = server.lm
    tools = tools_of(req.tools, req.tool_choice, getattr(lm.tokenizer, "chat_template", None))
    if req.parallel_tool_calls not in (None, True, False):
        raise ApiError(400, "parallel_tool_calls: expected a boolean", param="parallel_tool_calls")
    if req.parallel_tool_calls is False and tools is not None and tools.choice == "auto":
        raise ApiError(400, "parallel_tool_calls: false is honoured with tool_choice 'required' or a named function "
                            "(one call, by grammar); with 'auto' every call the answer holds is returned",
                       param="parallel_tool_calls")
    if tools is not None and req.response_format not in (None, {"type": "text"}):
        raise ApiError(400, "response_format: not combined with tools (a call's arguments follow its parameters)",
                       param="response_format")
    if lm.has_chat_template:
        from jinja2 import TemplateError

        try:
            ids = lm.encode_messages(template_messages(messages), tools=tools.for_template() if tools else None)
        except TemplateError as e:
            raise ApiError(400, f"messages: the chat template refused them: {e}", param="messages") from None
        call = tools.grammar(lm.tokenizer) if tools else None           # required / named: one call, its arguments checked
        return prepare(req, server, ids, chat_limit(req), "messages", tools=tools,
                       response_format=req.response_format, grammar=call)
    if why := lm.model.plain_chat_refusal:        # a family whose answers need its template
        raise ApiError(400, f"messages: {why}", param="messages")
    # as `fastdllm chat` does for such models: a plain 'User: / Assistant:' transcript
    system = "\n".join(m["content"] for m in messages if m["role"] == "system") or None
    turns = [m for m in messages if m["role"] != "system"]
    if not turns or turns[-1]["role"] != "user":
        raise ApiError(400, f"messages: {server.model_name} has no chat template; the last message must be "
                            "from the user", param="messages")
    ids = lm.encode(plain_transcript(system, turns[:-1], turns[-1]["content"]), chat=False)
    return prepare(req, server, ids, chat_limit(req), "messages", extra_stop=(PLAIN_TURN,),
                   response_format=req.response_format)


def message_of(m, i: int) -> dict:
    """A request message as the chat template reads it (content text; an assistant's tool calls; a
    tool result's call id)."""
    out = {"role": m.role, "content": "" if m.content is None and (m.tool_calls or m.role == "tool")
           else text_of(m.content, f"messages.{i}.content")}
    if m.tool_calls is not None:
        if m.role != "assistant" or not isinstance(m.tool_calls, list):
            raise ApiError(400, f"messages.{i}.tool_calls: only an assistant's, as a list", param=f"messages.{i}")
        out["tool_calls"] = m.tool_calls
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def chat_limit(req: ChatRequest) -> int | None:
    return req.max_tokens if req.max_completion_tokens is None else req.max_completion_tokens


def prepare_completion(body: Any, server: Server, response_format: Any = None) -> Prepared:
    """`response_format`: structured output (ollama's format), else the request's own field, which
    OpenAI's completions do not have and fastdllm's honour as chat's."""
    req = validated(CompletionRequest, body)
    refuse_not_taken(body, chat=False)
    response_format = req.response_format if response_format is None else response_format
    suffix = infill_suffix(req.suffix, server)
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise ApiError(400, f"prompt: {len(prompt)} prompts in one request; send one per request", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = server.lm.encode(prompt, chat=False)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = token_ids(prompt, server.lm)
    else:
        raise ApiError(400, "prompt: expected a string, a list of one string, or a list of token ids", param="prompt")
    if suffix is not None and not ids and server.lm.model.logit_shift:
        raise ApiError(400, f"prompt: empty, but {server.model_name} predicts each token from the one before it: "
                            f"infilling needs some text before the hole", param="prompt")
    return prepare(req, server, ids, req.max_tokens, "prompt", suffix=suffix, response_format=response_format)


def refuse_not_taken(body: dict, chat: bool) -> None:
    """A 400 naming a structured field this endpoint does not take (requests.NOT_TAKEN, CHAT_ONLY)."""
    for name in [*NOT_TAKEN, *(() if chat else CHAT_ONLY)]:
        if body.get(name) is not None:
            instead = NOT_TAKEN.get(name, "send it")
            if not chat and name in CHAT_ONLY:
                instead += " to /v1/chat/completions"
            where = "/v1/chat/completions" if chat else "/v1/completions"
            raise ApiError(400, f"{name}: not taken by {where} ({instead})", param=name)


def infill_suffix(suffix: Any, server: Server) -> list[int] | None:
    """OpenAI's `suffix`: the text after the answer (infilling); None or "" for none."""
    if suffix is None or suffix == "":
        return None
    if not isinstance(suffix, str):
        raise ApiError(400, "suffix: expected a string", param="suffix")
    if not server.lm.model.attention.bidirectional:
        raise ApiError(400, f"suffix: {server.model_name} cannot fill holes: its attention is causal between "
                            f"blocks, so what it writes never sees the suffix", param="suffix")
    ids = server.lm.encode(suffix, chat=False)
    if server.lm.specials.mask in ids:
        raise ApiError(400, "suffix: it holds the model's mask token", param="suffix")
    return ids


def text_of(content: Any, param: str) -> str:
    """A message's content: a string, or a list of {"type": "text", "text": ...} parts, joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError(400, f"{param}.{i}: only text parts are supported (got {kind!r})", param=param)
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(400, f"{param}: expected a string or a list of text parts", param=param)


def token_ids(ids: list[int], lm) -> list[int]:
    vocab = lm.model.get_input_embeddings().num_embeddings
    for i in ids:
        if not 0 <= i < vocab:
            raise ApiError(400, f"prompt: token id {i} is outside the vocabulary (0..{vocab - 1})", param="prompt")
        if i == lm.specials.mask:
            raise ApiError(400, f"prompt: token id {i} is the mask token", param="prompt")
    return list(ids)


def prepare(req: CommonRequest, server: Server, ids: list[int], max_tokens: int | None, prompt_param: str,
            extra_stop: tuple[str, ...] = (), suffix: list[int] | None = None, response_format: Any = None,
            tools: Any = None, grammar: str | None = None) -> Prepared:
    if req.model != server.model_name:
        raise ApiError(404, f"model '{req.model}' not found (this server serves '{server.model_name}')",
                       param="model", code="model_not_found")
    if req.n not in (None, 1):
        raise ApiError(400, f"n: only n=1 is supported (got {req.n})", param="n")
    for name, off in OFF_VALUES.items():
        value = getattr(req, name, None)
        if not any(same(value, v) for v in off):
            allowed = " or ".join("null" if v is None else repr(v) for v in off)
            raise ApiError(400, f"{name}: not supported (only {allowed})", param=name)
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, f"max_tokens: must be at least 1 (got {max_tokens})", param="max_tokens")
    if not ids and suffix is None:
        raise ApiError(400, f"{prompt_param}: the prompt is empty", param=prompt_param)
    stop = stop_strings(req.stop)
    extension = req.fastdllm if grammar is None else {**(req.fastdllm or {}), "grammar": grammar}
    if grammar is not None and any((req.fastdllm or {}).get(k) is not None for k in EXTENSION_KEYS):
        raise ApiError(400, "tool_choice: not combined with fastdllm.regex or fastdllm.grammar", param="tool_choice")
    constraint = constraint_of(response_format, extension, server, stop)
    if constraint is not None and suffix is not None:
        raise ApiError(400, "suffix: not combined with structured output (the text after a hole is not part of the "
                            "sentence)", param="suffix")
    extra_stop = () if constraint is not None else extra_stop     # the sentence ends the answer
    cfg, profile, steps, wanted = decode_config(req, server, max_tokens, len(ids), prompt_param, len(suffix or ()))
    return Prepared(ids, cfg, wanted, profile, stop + extra_stop, steps,
                    bool(req.stream), bool(req.stream and req.stream_options and req.stream_options.include_usage),
                    plain_chat=bool(extra_stop), suffix=suffix, constraint=constraint, tools=tools)


def same(value: Any, off: Any) -> bool:
    if off is None or isinstance(off, bool):
        return value is off
    return not isinstance(value, bool) and value == off


def stop_strings(stop: Any) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else [] if stop is None else stop
    if not (isinstance(stops, list) and len(stops) <= 4 and all(isinstance(s, str) and s for s in stops)):
        raise ApiError(400, "stop: expected a non-empty string or a list of up to 4", param="stop")
    return tuple(stops)


def decode_config(req: CommonRequest, server: Server, max_tokens: int | None, prompt_len: int,
                  prompt_param: str, suffix_len: int = 0) -> tuple[DecodeConfig, str, bool, int]:
    """The request's DecodeConfig, validated by the CLI's code: the server's profile and flags (or the
    request's profile re-resolved under the server's flags), then the `fastdllm` object, then the
    top-level temperature and seed. Returns (config, profile name, stream steps?, max_tokens)."""
    settings = {k: v for k, v in (req.fastdllm or {}).items() if k not in EXTENSION_KEYS}   # formats.py's
    name = settings.pop("profile", None) or server.profile_name
    steps = settings.get("steps")
    if isinstance(steps, bool):                     # a boolean asks for the step stream; an int is --steps
        del settings["steps"]
    if any(k.replace("-", "_") == "gen_len" for k in settings):
        raise ApiError(400, "fastdllm.gen_len: set the answer length with max_tokens", param="fastdllm.gen_len")
    base = server.base_cfg if name == server.profile_name else request_profile(name, server)
    try:
        parsed = DecodeConfig.parse(settings)
    except UserError as e:
        raise ApiError(400, f"fastdllm: {e}", param="fastdllm") from None
    for key in ("temperature", "seed"):             # the OpenAI fields win over the same keys in fastdllm
        if (value := getattr(req, key)) is not None:
            try:
                parsed.update(DecodeConfig.parse({key: value}))
            except UserError as e:
                raise ApiError(400, str(e), param=key) from None
    block = parsed.get("block_len", base.block_len)
    wanted = max_tokens or base.gen_len
    canvas = block_end(wanted, block)
    causal = server.lm.model.attention.causal
    if not fits([prompt_len], [canvas], block, causal, server.lm.context_length, suffix=suffix_len):
        needed = length([prompt_len], [canvas], block, causal) + suffix_len
        suffix = f", the suffix ({suffix_len} tokens)" if suffix_len else ""
        raise ApiError(400, f"the prompt ({prompt_len} tokens){suffix} and the answer's canvas ({canvas} tokens for "
                            f"max_tokens {wanted}) need {needed} tokens; this model's context is "
                            f"{server.lm.context_length}", param=prompt_param, code="context_length_exceeded")
    try:
        cfg = DecodeConfig.from_dict({**parsed, "gen_len": canvas}, base)
    except UserError as e:
        raise ApiError(400, f"fastdllm: {e}", param="fastdllm") from None
    return cfg, name, steps is True, wanted


def request_profile(name: Any, server: Server) -> DecodeConfig:
    """A profile named in a request, resolved as `fastdllm serve -P NAME` would be. Only profiles
    listed by name: a request never makes the server read a file path it chose."""
    found = {p.name: p for p in profiles.available()}
    if not isinstance(name, str) or name not in found:
        raise ApiError(400, f"fastdllm.profile: unknown profile {name!r} (available: {', '.join(found)})",
                       param="fastdllm.profile")
    try:
        return profiles.resolve(found[name], server.cli_flags, server.lm.path)
    except UserError as e:
        raise ApiError(400, f"fastdllm.profile: {e}", param="fastdllm.profile") from None
