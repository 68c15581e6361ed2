"""Infilling: templates, the canvas of holes, exactness of the cache, the CLI forms, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runner import invoke

from fastdllm.checkpoints import loading
from fastdllm.decode import infill
from fastdllm.decode.canvas import plan_infill
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import StepEvent, generate, run
from fastdllm.decode.events import Result
from fastdllm.decode.selection import predict
from fastdllm.errors import UserError

TEMPLATE = "def f(x):\n<|mask:7|>\n    y = x\n<|mask:5|>\n    return y\n"


pytestmark = pytest.mark.sweep   # each test's first case in the fast lane, the rest in the full suite (tests/conftest.py)


@pytest.fixture(scope="module", autouse=True)
def threads(one_thread):
    pass


def filling_of(lm, template: str, default_len: int = 8) -> infill.Filling:
    return infill.for_model(lm, infill.parse(template), default_len)


def test_parse_and_tokenize_place_the_holes(llada64):
    assert infill.parse("a<|mask:3|>b<|mask|>") == ["a", 3, "b", None, ""]
    f = filling_of(llada64, "def g():\n<|mask:3|>pass<|mask|>", default_len=6)
    (s1, e1), (s2, e2) = f.holes
    assert e1 - s1 == 3 and e2 - s2 == 6 and e2 == len(f.ids)
    assert all(f.ids[p] == llada64.specials.mask for s, e in f.holes for p in range(s, e))
    assert f.text_tokens == len(f.ids) - 9 and f.texts == ["def g():\n", "pass", ""]
    assert infill.completed(f, ["A", "B"]) == "def g():\nApassB"
    assert infill.cut([5, 6, 1, 7, 1], {1}, trim=True) == [5, 6] and infill.cut([5, 1], {1}, trim=False) == [5, 1]


@pytest.mark.parametrize("template, message", [
    ("no holes here", "no holes"),
    ("x = <|mask:abc|>", "line 1, column 5: unknown placeholder '<|mask:abc|>'"),
    ("x\n  <|mask:0|>", "line 2, column 3: unknown placeholder '<|mask:0|>'"),
    ("<|mask |>", "unknown placeholder '<|mask |>'"),
])
def test_template_mistakes_are_one_line_errors(template, message):
    with pytest.raises(UserError) as e:
        infill.parse(template)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_models_own_mask_token_in_the_text_is_refused(llada64):
    with pytest.raises(UserError, match="mask token"):
        filling_of(llada64, "x = <|mdm_mask|> + <|mask:2|>")


def test_holes_beyond_the_context_and_a_hole_first_for_a_shifted_family(llada64, dream64):
    f = filling_of(llada64, "x = <|mask:5000|>")
    with pytest.raises(UserError, match="context is 4096"):
        run(llada64.decoder, [f.ids], DecodeConfig(gen_len=32, block_len=32), holes=f.holes)
    f = filling_of(dream64, "<|mask:4|> = 1")
    with pytest.raises(UserError, match="starts with a hole"):
        run(dream64.decoder, [f.ids], DecodeConfig(gen_len=32, block_len=32), holes=f.holes)
    f = filling_of(llada64, "<|mask:4|> = 1")                 # LLaDA reads position p at p: fine
    assert len(run(llada64.decoder, [f.ids], DecodeConfig(gen_len=32, block_len=4), holes=f.holes).holes[0][0]) == 4


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("rule", ["threshold", "factor", "fixed", "dynamic", "sequential"])
def test_committed_text_never_changes_and_every_hole_fills(family, cache, rule, request):
    lm = request.getfixturevalue(f"{family}64")
    f = filling_of(lm, TEMPLATE)
    cfg = DecodeConfig(gen_len=8, block_len=4, cache=cache, rule=rule, threshold=0.6, steps=8)
    hole_at = {p for s, e in f.holes for p in range(s, e)}
    start = f.holes[0][0]
    committed = []
    for event in generate(lm.decoder, [f.ids], cfg, holes=f.holes):
        if isinstance(event, StepEvent):
            committed += (event.positions[0][event.committed[0]] + start).tolist()
        elif isinstance(event, Result):
            result = event
    assert sorted(committed) == sorted(hole_at)                 # each hole position once, nothing else
    region = result.canvas[0].tolist()
    for p, t in enumerate(f.ids[start:start + len(region)], start):
        assert region[p - start] == t or p in hole_at
    assert [len(h) for h in result.holes[0]] == [7, 5]
    assert lm.specials.mask not in sum(result.holes[0], [])
    assert result.blocks_decoded == 3                           # 12 masks in blocks of 4


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_cached_and_uncached_logits_are_equal_right_after_each_refresh(family, request):
    lm = request.getfixturevalue(f"{family}64")
    f = filling_of(lm, TEMPLATE)
    canvas = plan_infill(f.ids, f.holes, DecodeConfig(gen_len=8, block_len=4), mask=lm.specials.mask,
                         context_length=lm.context_length, causal=False, shifted=bool(lm.model.logit_shift))
    ids, T, shift = canvas.host, canvas.length, lm.model.logit_shift
    with torch.no_grad():
        plain = lm.model(ids).logits                                           # no cache at all
        for s, e in canvas.blocks:                                             # spans over holes and text
            positions = torch.arange(s, e)[None]
            cache = lm.model.new_cache(torch.ones_like(ids, dtype=torch.bool))
            full = lm.model.forward_span(ids, 0, T, cache, positions)          # the refresh
            prefix = lm.model.forward_span(ids, s, T, cache, positions)        # PrefixCache: suffix recomputed
            dual = lm.model.forward_span(ids, s, e, cache, positions)          # DualCache: suffix kept
            reference = plain[:, s - shift:e - shift]
            assert full.dtype == torch.float64
            for got in (full, prefix, dual):
                assert (got - reference).abs().max().item() < 1e-9


def naive_fill(lm, ids: list[int], threshold: float) -> list[list[int]]:
    """One block over all masked positions, no cache, the threshold rule written out: per step, the
    whole canvas through the model, every masked position at confidence >= threshold committed (at
    least the most confident). Returns each step's committed positions."""
    ids = torch.tensor([ids])
    shift, mask, steps = lm.model.logit_shift, lm.specials.mask, []
    while bool((ids == mask).any()):
        at = (ids[0] == mask).nonzero()[:, 0]
        with torch.no_grad():
            logits = lm.model(ids).logits[0, at - shift]
        tokens, conf = predict(logits[None], temperature=0.0, measure="prob", banned=torch.tensor([mask]),
                               generator=None)
        take = conf[0] >= threshold
        take[conf[0].argmax()] = True
        ids[0, at[take]] = tokens[0][take]
        steps.append(sorted(at[take].tolist()))
    return steps


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_holes_fill_together_by_confidence_not_in_template_order(family, request):
    lm = request.getfixturevalue(f"{family}64")
    f = filling_of(lm, TEMPLATE)
    cfg = DecodeConfig(gen_len=16, block_len=16, cache="none", threshold=0.6)
    start = f.holes[0][0]
    ours = [sorted((e.positions[0][e.committed[0]] + start).tolist())
            for e in generate(lm.decoder, [f.ids], cfg, holes=f.holes) if isinstance(e, StepEvent)]
    assert ours == naive_fill(lm, f.ids, 0.6)
    (s1, e1), (s2, e2) = f.holes
    first_full = next(i for i in range(len(ours)) if set(range(s1, e1)) <= set(sum(ours[:i + 1], [])))
    assert any(s2 <= p < e2 for step in ours[:first_full] for p in step)   # the later hole did not wait


def test_adjacent_holes_are_one_masked_span_reported_per_placeholder(llada64):
    cfg = DecodeConfig(gen_len=8, block_len=4, threshold=0.6)
    split, whole = filling_of(llada64, "a = (<|mask:3|><|mask:5|>)"), filling_of(llada64, "a = (<|mask:8|>)")
    assert split.ids == whole.ids
    one = run(llada64.decoder, [whole.ids], cfg, holes=whole.holes).holes[0]
    two = run(llada64.decoder, [split.ids], cfg, holes=split.holes).holes[0]
    assert two == [one[0][:3], one[0][3:]]


def test_block_causal_families_refuse_infilling(tiny):
    path = tiny("sdar")
    lm = loading.load(path, dtype="fp32")
    f = filling_of(lm, "x = <|mask:4|>\n")
    with pytest.raises(UserError, match="tiny-sdar cannot fill holes: its attention is causal between blocks"):
        run(lm.decoder, [f.ids], DecodeConfig(gen_len=32, block_len=4), holes=f.holes)
    r = invoke("generate", "-m", path, "--suffix", "return y", "def f(x):", "-n", "4", "--block-len", "4")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "cannot fill holes" in r.stderr


def test_suffix_json_gives_prefix_middle_suffix_and_the_figures(llada_dir, llada64):
    r = invoke("generate", "-m", llada_dir, "--suffix", "\n    return y\n", "def f(x):\n", "-n", "16",
               "--block-len", "8", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["prefix"] == "def f(x):\n" and d["suffix"] == "\n    return y\n" and d["text"] == d["middle"]
    assert d["holes"][0]["length"] == 16 and d["nfe"] >= 2 and d["config"]["block_len"] == 8
    f = filling_of(llada64, "def f(x):\n<|mask:16|>\n    return y\n")
    alone = run(llada64.decoder, [f.ids], DecodeConfig(gen_len=16, block_len=8, cache="dual"), holes=f.holes)
    assert d["holes"][0]["ids"] == infill.cut(alone.holes[0][0], set(llada64.specials.stops), True)
    assert d["generated_tokens"] == len(d["holes"][0]["ids"]) and d["prompt_tokens"] == f.text_tokens


def test_template_file_prints_the_completed_text(llada_dir, tmp_path):
    path = tmp_path / "t.py"
    path.write_text(TEMPLATE)
    r = invoke("generate", "-m", llada_dir, "--infill", path, "-n", "8", "--block-len", "4", "--json")
    d = json.loads(r.stdout)
    assert [h["length"] for h in d["holes"]] == [7, 5]
    pieces = TEMPLATE.replace("<|mask:5|>", "<|mask:7|>").split("<|mask:7|>")
    assert d["text"] == pieces[0] + d["holes"][0]["text"] + pieces[1] + d["holes"][1]["text"] + pieces[2]
    plain = invoke("generate", "-m", llada_dir, "--infill", path, "-n", "8", "--block-len", "4", "-q")
    assert plain.exit_code == 0 and plain.stdout == d["text"]          # the template ends with a newline
    piped = invoke("generate", "-m", llada_dir, "--infill", "-", "-n", "8", "--block-len", "4", "-q", input=TEMPLATE)
    assert piped.stdout == d["text"]


@pytest.mark.parametrize("args, code, message", [
    (["--infill", "{t}", "hello"], 2, "--infill FILE holds the whole text"),
    (["--suffix", "a", "--suffix-file", "{t}", "p"], 2, "not both"),
    (["--suffix", "", "p"], 2, "the suffix is empty"),
    (["--suffix", "a", "--chat", "p"], 2, "infilling works on raw text"),
    (["--infill", "{none}"], 1, "--infill: cannot read"),
    (["--infill", "{plain}"], 1, "the template has no holes"),
    (["--infill", "{bad}"], 1, "line 1, column 5: unknown placeholder"),
])
def test_infilling_flag_mistakes_are_one_line_errors(llada_dir, tmp_path, args, code, message):
    files = {"t": tmp_path / "t.txt", "none": tmp_path / "missing.txt", "plain": tmp_path / "plain.txt",
             "bad": tmp_path / "bad.txt"}
    files["t"].write_text("x = <|mask:2|>")
    files["plain"].write_text("x = 1\n")
    files["bad"].write_text("x = <|mask:-2|>\n")
    r = invoke("generate", "-m", llada_dir, *[a.format(**files) for a in args])
    assert r.exit_code == code and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_trim_cuts_each_hole_at_its_end_token(llada_dir, capsys):
    """A model that likes its end token pads: the end token's output row is made to beat the row
    of the token this model fills most with."""
    from fastdllm.cli.infill import fill

    lm = loading.load(llada_dir, dtype="fp64")
    head = lm.model.output_head if lm.model.output_head is not None else lm.model.embed
    eos = lm.specials.stops[0]
    f = filling_of(lm, TEMPLATE)
    cfg = DecodeConfig(gen_len=8, block_len=4)
    before = sum(run(lm.decoder, [f.ids], cfg, holes=f.holes).holes[0], [])
    with torch.no_grad():
        head.weight[eos] = head.weight[max(set(before), key=before.count)] * 1.5
    raw = run(lm.decoder, [f.ids], cfg, holes=f.holes).holes[0]
    assert any(eos in h[:-1] for h in raw), raw                  # some hole holds padding before its end
    records = {}
    for trim in (True, False):
        fill(lm, type("Profile", (), {"name": "default"}), cfg, infill.parse(TEMPLATE), "template", hole=8,
             trim=trim, json_out=True, live=False, quiet=True, verbose=False)
        records[trim] = json.loads(capsys.readouterr().out)
    for h, trimmed, kept in zip(raw, records[True]["holes"], records[False]["holes"]):
        assert kept["ids"] == h
        assert trimmed["ids"] == h[:h.index(eos)] if eos in h else trimmed["ids"] == h
    end = lm.tokenizer.convert_ids_to_tokens(eos)
    assert end in records[False]["text"] and end not in records[True]["text"]


def test_live_view_shows_the_text_dim_and_the_holes_filling(llada64):
    from rich.console import Console

    from fastdllm.terminal.view import MASK_GLYPH, InfillCanvas

    f = filling_of(llada64, TEMPLATE)
    console = Console(record=True, width=100, height=40, force_terminal=True, file=open("/dev/null", "w"))
    view = InfillCanvas(console, llada64.tokenizer, "tiny · infill", f.ids, f.holes, 4, llada64.specials.stops)
    cfg = DecodeConfig(gen_len=8, block_len=4, threshold=0.6)
    with view:
        for event in generate(llada64.decoder, [f.ids], cfg, holes=f.holes):
            if isinstance(event, StepEvent):
                view.update(event)
                if event.block == 1:
                    break
    header, body, footer = view.render().renderables
    assert header.plain == "tiny · infill" and footer.plain.startswith("block 2/3 · step 1")
    assert body.plain.startswith("def f(x):\n") and body.plain.endswith("    return y\n")
    assert body.plain.count(MASK_GLYPH) == 12 - view.committed > 0
    dim = "".join(body.plain[span.start:span.end] for span in body.spans if str(span.style) == "dim")
    assert "def f(x):" in dim and "return y" in dim and "y = x" in dim
    assert any(str(span.style).startswith("bold") for span in body.spans)   # the latest commits, coloured


def test_n_is_the_default_hole_length_in_any_number_of_tokens(llada_dir):
    r = invoke("generate", "-m", llada_dir, "--suffix", "return y", "def f(x):", "-n", "6", "--block-len", "4", "--json")
    d = json.loads(r.stdout)
    assert d["holes"][0]["length"] == 6 and d["config"]["gen_len"] == 8     # the config: whole blocks
    r = invoke("generate", "-m", llada_dir, "--infill", "-", "-n", "5", "--block-len", "4", "--json",
               input="a = <|mask|>; b = <|mask:2|>")
    assert [h["length"] for h in json.loads(r.stdout)["holes"]] == [5, 2]
