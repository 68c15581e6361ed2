"""Structured output (docs/specs/structured-output.md): every answer that claims to be complete parses and
validates, checked by an independent validator (jsonschema, re.fullmatch, json + the grammar's shape),
on random-weight tiny models of four families (LLaDA, Dream, SDAR, Fast-dLLM v2: bidirectional and
block-causal, shifted and not) in every cache mode under the threshold and factor rules; an answer
the length cuts says so (finish reason length) and is still a valid prefix; a free row of the
batch decodes as it would alone; bad constraints and unsupported settings are one-line errors."""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from fastdllm.checkpoints import loading  # noqa: E402
from fastdllm.testing.tiny_blockdiff import write_fast_dllm_v2, write_sdar  # noqa: E402
from fastdllm.decode.config import DecodeConfig  # noqa: E402
from fastdllm.decode.constraint import Compiled, Spec  # noqa: E402
from fastdllm.decode.engine import run  # noqa: E402
from fastdllm.errors import UserError  # noqa: E402

# bounded answers: each fits 64 tokens however the model spells it, so every one must complete
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "done", "n"],
          "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "done": {"type": "boolean"},
                         "n": {"type": "integer", "minimum": 0, "maximum": 999}}}
REGEX = r"(yes|no): [0-9]{1,3}(, [a-z]{2,5})?"
GRAMMAR = """start: "[" item ("," item)? "]"
item: NUMBER | "[" NUMBER ("," NUMBER)? "]"
NUMBER: /[0-9]{1,2}/
"""


def grammar_ok(text: str) -> bool:
    """GRAMMAR's sentences, checked without the grammar library: lists of 1-2 items, each a number
    of 1-2 digits (leading zeros allowed, so not JSON) or a list of 1-2 of them, no spaces."""
    item = r"(?:[0-9]{1,2}|\[[0-9]{1,2}(?:,[0-9]{1,2})?\])"
    return re.fullmatch(rf"\[{item}(?:,{item})?\]", text) is not None


def schema_ok(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


CHECKS = {"json_schema": (json.dumps(SCHEMA), schema_ok), "regex": (REGEX, lambda t: re.fullmatch(REGEX, t) is not None),
          "grammar": (GRAMMAR, grammar_ok)}


@pytest.fixture(scope="module")
def families(llada_dir, dream_dir, tmp_path_factory):
    """The four families in float32, each with its compiled constraints (one llguidance tokenizer
    per tokenizer: seconds for the 152k Qwen vocabulary)."""
    root = tmp_path_factory.mktemp("structured")
    paths = {"llada": llada_dir, "dream": dream_dir, "sdar": write_sdar(root / "sdar"),
             "fast_dllm_v2": write_fast_dllm_v2(root / "v2")}
    out = {}
    for name, path in paths.items():
        lm = loading.load(path, dtype="fp32")
        out[name] = lm, {kind: Compiled(Spec(kind, source), lm.tokenizer) for kind, (source, _) in CHECKS.items()}
    return out


def every_mode(lm, compiled, prompt):
    """((cache, rule, kind), its checker, the Result) for every cache mode x rule x constraint kind."""
    for cache in ("none", "prefix", "dual"):
        for rule in ("threshold", "factor"):
            cfg = DecodeConfig(gen_len=64, block_len=32, cache=cache, rule=rule)
            for kind, (_, ok) in CHECKS.items():
                yield (cache, rule, kind), ok, run(lm.decoder, [prompt], cfg, constraints=[compiled[kind]])


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "fast_dllm_v2"])
def test_every_answer_validates_in_every_cache_mode_and_rule(families, family, one_thread):
    lm, compiled = families[family]
    prompt = lm.encode("Give the answer.", chat=True)
    valid = total = 0
    for where, ok, r in every_mode(lm, compiled, prompt):
        total += 1
        valid += r.complete[0] and ok(r.texts[0])
        assert r.complete == [True] and r.finish_reasons == ["stop"], (where, r.texts[0])
        assert ok(r.texts[0]), (where, r.texts[0])
    print(f"{family}: {valid}/{total} answers valid")
    assert valid == total == 18


def test_several_tokens_commit_in_one_step(families, one_thread):
    """A run from the frontier commits together (here the schema's forced keys and punctuation):
    fewer forwards than tokens, where one token per step would need one forward each."""
    lm, compiled = families["sdar"]
    r = run(lm.decoder, [lm.encode("Give the answer.", chat=True)], DecodeConfig(gen_len=64, block_len=32),
            constraints=[compiled["json_schema"]])
    assert r.complete == [True] and schema_ok(r.texts[0])
    assert r.nfe < 0.6 * len(r.ids[0]), (r.nfe, len(r.ids[0]))          # 11 forwards for 21 tokens here


def test_decide_keeps_the_valid_confident_run_from_the_frontier(families):
    """decide: of the rule's choice, the frontier and each next chosen candidate whose token is valid
    after its predecessors; the first invalid or unchosen one and everything after stay masked."""
    from fastdllm.decode.constraint import RowConstraints

    lm, _ = families["llada"]
    free = Compiled(Spec("regex", "[a-z0-9: ]{1,20}"), lm.tokenizer)             # nothing forced
    good = lm.tokenizer.encode("yes: 12", add_special_tokens=False)
    bad = lm.tokenizer.encode("X", add_special_tokens=False)
    K = len(good) + 2
    tokens = torch.tensor([good + bad + good[:1]])
    candidate = torch.ones(1, K, dtype=torch.bool)
    rows = RowConstraints([free], lm.specials.stops)
    _, chosen = rows.decide(tokens, torch.ones(1, K, dtype=torch.bool), candidate)
    assert len(bad) == 1 and chosen[0].tolist() == [True] * len(good) + [False, False]
    rows = RowConstraints([free], lm.specials.stops)
    unchosen = torch.tensor([[True, False] + [True] * (K - 2)])
    _, chosen = rows.decide(tokens, unchosen, candidate)
    assert chosen[0].tolist() == [True] + [False] * (K - 1)


def test_an_answer_longer_than_its_length_ends_with_length(families, one_thread):
    lm, _ = families["llada"]
    long = Compiled(Spec("json_schema", json.dumps({"type": "string", "minLength": 400})), lm.tokenizer)
    r = run(lm.decoder, [lm.encode("Say it.", chat=True)], DecodeConfig(gen_len=32, block_len=32), constraints=[long])
    assert r.complete == [False] and r.finish_reasons == ["length"]
    assert r.to_dict()["finish_reason"] == "length"
    m = long.matcher()
    assert r.ids[0] and m.consume_tokens(r.ids[0]) and not m.is_accepting()      # a valid prefix, not a sentence
    assert r.texts[0].startswith('"')


def test_a_free_row_decodes_as_it_would_alone(families, one_thread):
    lm, compiled = families["llada"]
    prompt = lm.encode("Give the answer.", chat=True)
    cfg = DecodeConfig(gen_len=64, block_len=32, cache="dual")
    both = run(lm.decoder, [prompt, prompt], cfg, constraints=[compiled["regex"], None])
    alone = run(lm.decoder, [prompt], cfg)
    assert both.ids[1] == alone.ids[0]
    assert both.complete == [True, None] and re.fullmatch(REGEX, both.texts[0])
    assert not re.fullmatch(REGEX, alone.texts[0])                       # the constraint did the work


@pytest.mark.parametrize("kind, source, message", [
    ("json_schema", "{not json", "JSON Schema: not JSON"),
    ("json_schema", json.dumps({"not": {"type": "string"}}), 'Unimplemented keys: ["not"]'),
    ("json_schema", json.dumps({"type": "integer", "minimum": 5, "maximum": 1}), "Unsatisfiable schema"),
    ("json_schema", "[1, 2]", "expected an object"),
    ("regex", "a(", "unclosed group"),
    ("regex", r"[^\s\S]", "matches nothing"),
    ("grammar", "start: foo\n", 'unknown name: "foo"'),
])
def test_a_bad_constraint_is_one_line(families, kind, source, message):
    lm, _ = families["llada"]
    with pytest.raises(UserError) as e:
        Compiled(Spec(kind, source), lm.tokenizer)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("settings, name", [({"edit_threshold": 0.9}, "edit_threshold"),
                                             ({"prophet": True, "answer_anchor": "20:The"}, "prophet")])
def test_settings_that_cannot_honour_a_constraint_are_refused(families, settings, name):
    lm, compiled = families["llada"]
    cfg = DecodeConfig.from_dict(dict(settings, gen_len=32))
    with pytest.raises(UserError, match=f"structured output: not combined with {name}"):
        run(lm.decoder, [lm.encode("Hi", chat=True)], cfg, constraints=[compiled["regex"]])


def test_the_frontier_mask_allows_only_valid_tokens(families):
    """restrict: at the frontier every token left finite is one the matcher accepts; the end tokens
    only once the answer is complete."""
    from fastdllm.decode.constraint import RowConstraints

    lm, compiled = families["llada"]
    rows = RowConstraints([compiled["regex"]], lm.specials.stops)
    V = lm.model.get_input_embeddings().num_embeddings
    logits = rows.restrict(torch.zeros(1, 2, V), torch.tensor([[True, True]]))
    allowed = logits[0, 0].isfinite().nonzero()[:, 0].tolist()
    assert allowed and all(compiled["regex"].matcher().validate_tokens([t]) == 1 for t in allowed)
    assert not set(lm.specials.stops) & set(allowed)
    assert bool(logits[0, 1].isfinite().all())                      # right of the frontier: untouched


@pytest.mark.slow
@pytest.mark.parametrize("family", ["builtin", "llada_moe", "llada2_moe", "sdar_moe", "rnd1"])
def test_more_families_and_the_builtin_model_answer_valid_sentences(family, tmp_path, one_thread):
    """The same sweep on the built-in model and the MoE and RND1 families (slow lane). RND1's rules
    decode one global canvas (block_len = gen_len); the others take blocks of 32."""
    from fastdllm.checkpoints.locate import resolve_model_dir
    from fastdllm.testing.tiny_moe import write_llada2_moe, write_llada_moe
    from fastdllm.testing.tiny_rnd1 import write_rnd1
    from fastdllm.testing.tiny_sdar_moe import write_sdar_moe

    writers = {"builtin": lambda p: resolve_model_dir(None), "llada_moe": write_llada_moe,
               "llada2_moe": write_llada2_moe, "sdar_moe": write_sdar_moe, "rnd1": write_rnd1}
    lm = loading.load(writers[family](tmp_path / family), dtype="fp32")
    compiled = {kind: Compiled(Spec(kind, source), lm.tokenizer) for kind, (source, _) in CHECKS.items()}
    prompt = lm.encode("Give the answer.", chat=lm.has_chat_template)
    valid = total = 0
    for where, ok, r in every_mode(lm, compiled, prompt):
        total += 1
        valid += bool(r.complete[0] and ok(r.texts[0]))
        assert r.complete == [True] and ok(r.texts[0]), (where, r.texts[0])
    print(f"{family}: {valid}/{total} answers valid")
    assert valid == total == 18


def test_the_live_view_draws_the_frontier_apart():
    """A constrained run's live canvas marks its first masked position (where the grammar is checked
    next); an unconstrained one draws every mask alike."""
    from io import StringIO
    from types import SimpleNamespace

    from rich.console import Console

    from fastdllm.decode.events import StepEvent
    from fastdllm.terminal.view import FRONTIER_STYLE, MASK_GLYPH, LiveCanvas

    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=False: f"<{ids[0]}>")
    step = StepEvent(block=0, step=0, nfe=1, span=(0, 4), positions=torch.tensor([[0, 1, 2, 3]]),
                     tokens=torch.tensor([[7, 8, 9, 9]]), confidences=torch.full((1, 4), 0.9),
                     committed=torch.tensor([[True, False, False, False]]))
    styles = {}
    for constrained in (True, False):
        view = LiveCanvas(Console(file=StringIO(), width=80), tokenizer, "h", gen_len=4, block_len=4, stops=(0,),
                          constrained=constrained)
        view.update(step)
        body = view.render().renderables[1]
        styles[constrained] = [str(s.style) for s in body.spans if body.plain[s.start:s.end] == MASK_GLYPH]
    assert styles[True][0] == FRONTIER_STYLE and FRONTIER_STYLE not in styles[True][1:] and len(styles[True]) == 3
    assert FRONTIER_STYLE not in styles[False] and len(styles[False]) == 3
