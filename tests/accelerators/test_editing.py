"""Token editing (LLaDA2.1, docs/specs/llada2-editing.md) against the independent float64 transcription of
the checkpoint's `generate` (tests/references/reference_editing.py) on tiny LLaDA2 checkpoints: the masks
committed and the tokens edited at every step, post-fill rounds and how each block ends, NFE, the
final canvas; every cache mode; prompts on and off block boundaries; batches against rows alone;
early stop; the refusals."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import reference_editing as edit_ref
import reference_moe as ref
import torch
from helpers import prompt_of, scheduler_answers
from mask_heavy import heavy_copy, max_mask_probability

from fastdllm.checkpoints import loading
from fastdllm.decode.config import ConfigError, DecodeConfig
from fastdllm.decode.combinations import refuse_family
from fastdllm.decode.engine import run
from fastdllm.decode.events import StepEvent
from fastdllm.errors import UserError

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]


@pytest.fixture(scope="module")
def models(tiny, tmp_path_factory):
    """name -> (float64 LoadedModel, naive reference): the docs' fixture, and its copy whose mask
    row takes real probability (tests/mask_heavy.py)."""
    path = tiny("llada2_moe")
    lm = loading.load(path, dtype="fp64")
    canvas = prompt_of(5, seed=None) + [lm.specials.mask] * 32
    heavy = heavy_copy(lm, tmp_path_factory.mktemp("heavy") / "llada2", canvas)
    assert max_mask_probability(heavy, canvas) > 0.05
    ref.BANNED[:] = [lm.specials.mask]                     # fastdllm never predicts the mask id
    yield {"llada2": (lm, ref.NaiveLLaDA2(path)), "heavy": (heavy, ref.NaiveLLaDA2(heavy.path))}
    ref.BANNED[:] = []


def config(gen_len=32, threshold=0.7, edit=0.5, post=16, cache="prefix", early_stop=False) -> DecodeConfig:
    return DecodeConfig(gen_len=gen_len, block_len=32, rule="dynamic", threshold=threshold, edit_threshold=edit,
                        max_post_steps=post, cache=cache, early_stop=early_stop)


def decode(lm, prompts, cfg):
    """Per row the denoising steps as (committed pairs, edited pairs) in reference coordinates
    (prompt + generation), the store passes, the Result."""
    events = []
    result = run(lm.decoder, prompts, cfg, on_event=lambda e: events.append(e) if isinstance(e, StepEvent) else None)
    steps, stores = [[] for _ in prompts], sum(e.step < 0 for e in events)
    for e in (e for e in events if e.step >= 0):
        for row, prompt in enumerate(prompts):
            steps[row].append(tuple(sorted((int(p) + len(prompt), int(t)) for p, t, f in
                                           zip(e.positions[row], e.tokens[row], flags) if f)
                                    for flags in (e.committed[row], e.edited[row])))
    return steps, stores, result


def reference(naive, lm, prompt, gen_len=32, threshold=0.7, edit=0.5, post=16, **kw):
    return edit_ref.editing_generate(naive, prompt, mask_id=lm.specials.mask, eos_id=lm.specials.stops[0],
                                     gen_length=gen_len, threshold=threshold, edit_threshold=edit, max_post_steps=post, **kw)


# (fixture, prompt length, gen_len, threshold, edit threshold, max_post_steps): the model card's
# Quality and Speed modes, a strict edit threshold (blocks end on the no-change exit), no post-fill
# budget (edits only beside commits); prompts ending inside, at the end of and one past a block
CASES = [("llada2", 5, 32, 0.7, 0.5, 16), ("llada2", 32, 32, 0.5, 0.0, 16), ("llada2", 33, 64, 0.7, 0.9, 16),
         ("llada2", 31, 64, 0.7, 0.5, 0), ("llada2", 63, 32, 0.5, 0.5, 3), ("heavy", 5, 64, 0.7, 0.5, 16),
         ("heavy", 40, 32, 0.5, 0.0, 4)]


@pytest.mark.parametrize("name, length, gen_len, threshold, edit, post", CASES)
def test_editing_decodes_as_its_generate(models, name, length, gen_len, threshold, edit, post):
    """The same masks committed and tokens edited at every step, post-fill rounds included, under
    every cache mode; NFE = the reference's forwards + the store passes of blocks that ended on the budget."""
    lm, naive = models[name]
    prompt = prompt_of(length, seed=None)
    trace = reference(naive, lm, prompt, gen_len, threshold, edit, post)
    expected = [(s.committed, s.edited) for s in trace.steps]
    for cache in ("prefix", "none", "dual"):
        steps, stores, result = decode(lm, [prompt], config(gen_len, threshold, edit, post, cache))
        assert steps[0] == expected, cache
        assert result.canvas[0].tolist() == trace.canvas[length:]
        assert stores == trace.stores(32) and result.nfe == trace.nfe + stores
        assert result.edits == trace.edits and result.to_dict()["edits"] == trace.edits


def test_the_cases_cover_what_editing_does(models):
    """The comparisons above are not vacuous: edits happen while masks remain and in post-fill
    rounds, edits overwrite earlier edits, blocks end both ways, and a prompt's tail is never edited."""
    seen = {"mid-fill": 0, "post-fill": 0, "re-edit": 0, "no-change": 0, "budget": 0}
    for name, length, gen_len, threshold, edit, post in CASES:
        lm, naive = models[name]
        trace = reference(naive, lm, prompt_of(length, seed=None), gen_len, threshold, edit, post)
        edited_before = set()
        for s in trace.steps:
            seen["post-fill" if s.post else "mid-fill"] += len(s.edited)
            seen["re-edit"] += sum(p in edited_before for p, _ in s.edited)
            edited_before |= {p for p, _ in s.edited}
            assert all(p >= length for p, _ in s.edited) and all(s.was[p] != t for p, t in s.edited)
        for end in trace.ends.values():
            seen[end] += 1
    assert all(n > 0 for n in seen.values()), seen


def test_batch_equals_rows_alone(models):
    """Rows of different prompt lengths (left-padded by whole blocks) decode as alone, edits included."""
    lm, _ = models["llada2"]
    prompts = [prompt_of(n, seed=None) for n in (5, 33, 40)]
    cfg = config(gen_len=64, threshold=0.5, edit=0.0, post=4)
    steps, _, batch = decode(lm, prompts, cfg)
    total = 0
    for row, prompt in enumerate(prompts):
        alone_steps, _, alone = decode(lm, [prompt], cfg)
        width = alone.canvas.shape[1]
        assert batch.canvas[row, :width].tolist() == alone.canvas[0].tolist() and batch.ids[row] == alone.ids[0]
        mine = [s for s in steps[row] if s != ([], [])]           # the row's own steps (others' steps are empty)
        assert mine == [s for s in alone_steps[0] if s != ([], [])]
        total += alone.edits
    assert batch.edits == total > 0


def test_edit_threshold_one_never_edits(models):
    """p > 1 never holds: the tokens of decoding without editing, one post-fill round per block (its
    no-change exit), whose forward stores the block: NFE one more than without editing."""
    lm, _ = models["llada2"]
    prompt = prompt_of(11, seed=None)
    plain = run(lm.decoder, [prompt], config(gen_len=64, edit=None))
    never = run(lm.decoder, [prompt], config(gen_len=64, edit=1.0))
    assert never.canvas.tolist() == plain.canvas.tolist() and never.edits == plain.edits == 0
    assert never.nfe == plain.nfe + 1


def test_early_stop_waits_for_the_block_end(models):
    """A stop token can be edited away: with editing the answer is checked after each block (never
    mid-block), and the answer up to the stop is the one decoded without early stop."""
    lm, naive = models["llada2"]
    prompt = prompt_of(5, seed=None)
    full = reference(naive, lm, prompt, 96, 0.5, 0.0, 4)
    stop = full.canvas[5 + 40]                                  # a token the model writes in block 1
    decoder = replace(lm.decoder, specials=replace(lm.decoder.specials, stops=(stop,)))
    stopped = run(decoder, [prompt], config(gen_len=96, threshold=0.5, edit=0.0, post=4, early_stop=True))
    cut = full.canvas[5:].index(stop)
    assert stopped.ids[0] == full.canvas[5:5 + cut] and stopped.early_stopped
    assert stopped.blocks_decoded == (5 + cut) // 32 + 1        # up to the block holding the stop


def test_refusals(models, llada64):
    with pytest.raises(ConfigError, match="confidence must be prob"):
        DecodeConfig(edit_threshold=0.5, confidence="margin")
    with pytest.raises(ConfigError, match="sub_block_len"):
        DecodeConfig(edit_threshold=0.5, sub_block_len=8)
    with pytest.raises(ConfigError, match="resamples whole canvases"):
        DecodeConfig(edit_threshold=0.5, rule="eb_sampler")
    with pytest.raises(ConfigError, match="above the maximum"):
        DecodeConfig(edit_threshold=1.5)
    with pytest.raises(UserError, match="attends bidirectionally") as e:
        run(llada64.decoder, [[5, 6, 7]], DecodeConfig(gen_len=32, edit_threshold=0.5))
    assert "\n" not in str(e.value)
    shifted = SimpleNamespace(logit_shift=1, sampler="mask", attention=SimpleNamespace(kind="block-causal", causal=True))
    with pytest.raises(UserError, match="from the one before it"):
        refuse_family(shifted, "tiny-v2", "edit_threshold", UserError)


def test_view_shows_an_edit_in_its_own_colour():
    """The live canvas writes an edited token over the old one and colours it apart from commits."""
    from io import StringIO

    from rich.console import Console

    from fastdllm.terminal.view import EDIT_STYLE, LiveCanvas

    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=False: f"<{ids[0]}>")
    view = LiveCanvas(Console(file=StringIO(), width=80), tokenizer, "h", gen_len=4, block_len=4, stops=(0,))
    positions, no = torch.tensor([[0, 1, 2, 3]]), torch.zeros(1, 4, dtype=torch.bool)
    step = {"block": 0, "span": (0, 4), "positions": positions, "confidences": torch.full((1, 4), 0.95)}
    view.update(StepEvent(step=0, nfe=1, tokens=torch.tensor([[7, 8, 9, 9]]), committed=torch.tensor([[1, 1, 0, 0]]).bool(),
                          edited=no, **step))
    view.update(StepEvent(step=1, nfe=2, tokens=torch.tensor([[5, 8, 9, 9]]), committed=torch.tensor([[0, 0, 1, 0]]).bool(),
                          edited=torch.tensor([[1, 0, 0, 0]]).bool(), **step))
    body = view.render().renderables[1]
    styles = {body.plain[s.start:s.end]: str(s.style) for s in body.spans}
    assert view.tokens[:3] == [5, 8, 9] and styles["<5>"] == EDIT_STYLE and styles["<9>"] != EDIT_STYLE
    assert view.edits == 1 and view.committed == 3
    assert "· 1 edit ·" in view.frame(body, 1).renderables[2].plain                 # one edit, singular


def test_profiles_and_the_cli(models):
    """The model card's two modes as profiles; `generate --json` counts edits; the flags set them."""
    import json

    from cli_runner import invoke

    from fastdllm.decode import profiles

    quality, speed = (profiles.resolve(profiles.find(n), {}) for n in ("llada2-quality", "llada2-speed"))
    assert (quality.threshold, quality.edit_threshold, speed.threshold, speed.edit_threshold) == (0.7, 0.5, 0.5, 0.0)
    assert quality.max_post_steps == speed.max_post_steps == 16 and quality.block_len == speed.block_len == 32
    assert quality.rule == speed.rule == "dynamic" and quality.steps_per_block == 32    # at least one per step
    lm, _ = models["llada2"]
    record = json.loads(invoke("generate", "-m", lm.path, "-P", "llada2-speed", "--json", "-n", "64", "--no-early-stop",
                            "--raw", "def f(x):").stdout)
    assert record["config"]["edit_threshold"] == 0.0 and record["edits"] > 0
    record = json.loads(invoke("generate", "-m", lm.path, "--edit-threshold", "0.9", "--max-post-steps", "2", "--json",
                            "-n", "32", "--raw", "def f(x):").stdout)
    assert (record["config"]["edit_threshold"], record["config"]["max_post_steps"]) == (0.9, 2)


def test_serve_takes_editing_per_request(models):
    """The request's `fastdllm` object (or a profile named there) turns editing on; the scheduler
    decodes each editing job as alone and counts its edits."""
    from fastdllm.serve.protocol import prepare_completion
    from fastdllm.serve.server import Server

    lm, _ = models["llada2"]
    server = Server(lm, DecodeConfig(gen_len=64, rule="dynamic", threshold=0.95), "llada2", {})
    body = {"model": lm.path.name, "prompt": prompt_of(9, seed=None), "max_tokens": 64}
    assert prepare_completion(body, server).cfg.edit_threshold is None
    assert prepare_completion({**body, "fastdllm": {"profile": "llada2-quality"}}, server).cfg.edit_threshold == 0.5
    cfg = prepare_completion({**body, "fastdllm": {"edit_threshold": 0.0, "max_post_steps": 4, "threshold": 0.5,
                                                   "early_stop": False}}, server).cfg
    assert (cfg.edit_threshold, cfg.max_post_steps) == (0.0, 4)
    prompts = {f"r{n}": prompt_of(n, seed=None) for n in (9, 33, 40)}
    got = scheduler_answers(lm.decoder, prompts, cfg)
    for name, prompt in prompts.items():
        alone = run(lm.decoder, [prompt], cfg)
        assert got[name].ids == alone.ids[0] and got[name].edits == alone.edits > 0


def test_bench_rows(models):
    """LLaDA2 models get the editing modes beside the same thresholds without editing."""
    from fastdllm.bench.cases import Sweep, expand, pick_rows, table_for
    from fastdllm.decode.rules import rule_fields, rule_text

    lm, _ = models["llada2"]
    table = table_for(lm.path)
    cases = {c.name: c.cfg for c in expand(pick_rows(["edit-quality", "quality-no-edit", "edit-speed"], table=table),
                                          Sweep(gen_len=(64,)), lm.path)}
    assert (cases["edit-quality"].edit_threshold, cases["edit-speed"].edit_threshold) == (0.5, 0.0)
    assert cases["quality-no-edit"] == replace(cases["edit-quality"], edit_threshold=None)
    assert rule_text(rule_fields(cases["edit-quality"])) == "d=0.7 e>0.5"
    assert "edit-quality" not in table_for(None)


def test_bench_counts_edits_per_block(models):
    """The edits/block column: written tokens overwritten per block (random weights edit a lot);
    None for a row without editing."""
    import json

    from cli_runner import invoke

    lm, _ = models["llada2"]
    r = invoke("bench", "-m", lm.path, "--dtype", "fp64", "-n", "64", "--n-prompts", "1", "--warmup", "0",
            "-c", "edit-speed,speed-no-edit", "--no-early-stop", "-r", "1", "-o", "json")
    assert r.exit_code == 0, r.stderr
    records = {x["config"]: x for x in json.loads(r.stdout)["records"]}
    assert records["speed-no-edit"]["edits_per_block"] is None
    assert records["edit-speed"]["edits_per_block"] > 0
