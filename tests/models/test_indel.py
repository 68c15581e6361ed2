"""LLaDA2.2's insert/delete decoding (docs/specs/llada2-2.md §3) against the independent float64
transcription tests/references/reference_indel.py, step by step: masks committed, tokens edited, DELETE and
SPLIT positions, the block after the edits, block ends, NFE; under every cache mode, prompts on and
off the block grid, a batch against its rows alone. The fixture makes deletions, insertions and the
anti-loop rule happen: its DELETE and SPLIT head rows are slightly scaled copies of the rows of two
words the model predicts often, so each wins where its word would."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import reference_indel as indel_ref
import reference_moe as ref
import torch
from helpers import prompt_of, scheduler_answers
from mask_heavy import often_predicted_word
from safetensors.torch import load_file, save_file

from fastdllm.checkpoints import loading
from fastdllm.decode.indel import RowBlock
from fastdllm.testing.tiny_moe import write_llada2_2
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.decode.events import StepEvent
from fastdllm.errors import UserError

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]

DELETE, SPLIT = 3990, 3991


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_llada2_2(tmp_path_factory.mktemp("ckpt") / "llada2.2", delete_token_id=DELETE, split_token_id=SPLIT)
    lm = loading.load(path, dtype="fp64")
    canvas = prompt_of(5, seed=5) + [lm.specials.mask] * 32
    words = [often_predicted_word(lm, canvas, rank) for rank in (1, 2)]
    for shard in sorted(path.glob("*.safetensors")):
        tensors = load_file(str(shard))
        if "lm_head.weight" in tensors:
            head = tensors["lm_head.weight"]
            head[DELETE], head[SPLIT] = head[words[0]] * 1.02, head[words[1]] * 1.02
            save_file(tensors, str(shard), metadata={"format": "pt"})
    lm = loading.load(path, dtype="fp64")
    ref.BANNED[:] = [lm.specials.mask]
    yield lm, ref.NaiveLLaDA2(path)
    ref.BANNED[:] = []


def config(threshold=0.5, edit=0.0, post=16, cache="prefix", gen_len=32) -> DecodeConfig:
    return DecodeConfig(gen_len=gen_len, block_len=32, rule="dynamic", threshold=threshold, edit_threshold=edit,
                        max_post_steps=post, cache=cache, early_stop=False, indel=True)


def decode(lm, prompts, cfg):
    """Per row its steps as (committed, edited, deleted, inserted, block after) in block offsets."""
    events = []
    result = run(lm.decoder, prompts, cfg, on_event=lambda e: events.append(e) if isinstance(e, StepEvent) else None)
    steps, stores = [[] for _ in prompts], sum(e.step < 0 for e in events)
    for e in (e for e in events if e.step >= 0):
        for row in range(len(prompts)):
            if not (e.committed[row].any() or e.edited[row].any()):
                continue
            at = lambda f: [int(i) for i in f[row].nonzero().flatten()]          # noqa: E731
            steps[row].append((at(e.committed), at(e.edited), at(e.deleted), at(e.inserted), e.tokens[row].tolist()))
    return steps, stores, result


def reference(lm, naive, prompt, threshold=0.5, edit=0.0, post=16, gen_len=32):
    return indel_ref.indel_generate(naive, prompt, mask_id=lm.specials.mask, eos_id=lm.specials.stops[0],
                                    delete_id=DELETE, split_id=SPLIT, gen_length=gen_len, threshold=threshold,
                                    edit_threshold=edit, max_post_steps=post)


def expected(trace):
    return [([i for i, _ in s.committed], [i for i, _ in s.edited], s.deleted, s.split, s.after) for s in trace.steps]


CASES = [(5, 0.5, 0.0, 16, 32), (32, 0.5, 0.0, 16, 32), (33, 0.7, 0.5, 4, 64), (63, 0.5, 0.0, 16, 32), (20, 0.5, 0.3, 1, 32),
         (40, 0.9, 0.9, 0, 32), (63, 0.5, 0.3, 16, 32)]


@pytest.mark.parametrize("length, threshold, edit, post, gen_len", CASES)
def test_indel_decodes_as_the_reference(model, length, threshold, edit, post, gen_len):
    lm, naive = model
    prompt = prompt_of(length, seed=length)
    trace = reference(lm, naive, prompt, threshold, edit, post, gen_len)
    for cache in ("prefix", "none", "dual"):
        steps, stores, result = decode(lm, [prompt], config(threshold, edit, post, cache, gen_len))
        assert steps[0] == expected(trace), cache
        assert result.canvas[0].tolist() == trace.canvas[length:length + result.canvas.shape[1]]
        assert result.nfe == trace.nfe + stores


def test_the_cases_make_deletions_insertions_and_the_anti_loop_happen(model):
    lm, naive = model
    traces = [reference(lm, naive, prompt_of(n, seed=n), t, e, p, g) for n, t, e, p, g in CASES]
    steps = [s for tr in traces for s in tr.steps]
    assert sum(len(s.deleted) for s in steps) > 0 and sum(len(s.split) for s in steps) > 0
    assert any(s.looped is not None for s in steps) and any(s.edited for s in steps)
    ends = [end for tr in traces for end in tr.ends.values()]
    assert "done" in ends and "forced" in ends


class Scripted:
    """A fake model over a block of 8 whose predictions follow the block's state: a mask at the
    block's end takes token 1; else the leftmost mask takes SPLIT (runner-up token 4), and while the
    end is masked the leftmost mask takes token 2; other masks token 3; tokens stay themselves. So
    the end is filled, then a SPLIT pushes that token out: the original masks survive the SPLIT
    and the block needs about two steps per original mask, past the step cap."""
    V, MASK, DELETE, SPLIT, B = 16, 15, 14, 13, 8

    def forward(self, ids, attention=None, *, block_length=None, rows=None):
        block = ids[-self.B:]
        masked = [i for i, t in enumerate(block) if t == self.MASK]
        logits = torch.zeros(self.B, self.V, dtype=torch.float64)
        for i, t in enumerate(block):
            if t != self.MASK:
                logits[i, t] = 20.0
            elif i == self.B - 1:
                logits[i, 1] = 20.0
            elif i == masked[0] and block[-1] != self.MASK:
                logits[i, self.SPLIT], logits[i, 4] = 20.0, 5.0
            else:
                logits[i, 2 if i == masked[0] else 3] = 10.0 if i == masked[0] else 1.0
        return logits


@pytest.mark.parametrize("post", [0, 1, 3])
def test_the_step_cap_force_finishes_as_sglang(post):
    """docs/specs/llada2-2.md §3 4 (ID-2): a block's step whose count exceeds block_size + budget writes
    every mask (DELETE/SPLIT replaced by the runner-up) and ends the block; the step reaching it is
    an ordinary one. RowBlock's steps against the reference's on the scripted model."""
    fake, ref.BANNED[:] = Scripted(), [Scripted.MASK]
    try:
        trace = indel_ref.indel_generate(fake, [], mask_id=fake.MASK, eos_id=0, delete_id=fake.DELETE,
                                         split_id=fake.SPLIT, gen_length=fake.B, block_length=fake.B,
                                         threshold=1.0, max_post_steps=post)
    finally:
        ref.BANNED[:] = []
    assert trace.ends == {0: "capped"} and len(trace.steps) == fake.B + post + 1
    assert fake.MASK not in trace.steps[-1].after and trace.steps[-2].after.count(fake.MASK) > 1
    cfg = config(threshold=1.0, post=post)
    row, cur, steps = RowBlock([fake.MASK] * fake.B, fake.MASK, 0), [fake.MASK] * fake.B, []
    while row.live:
        tokens, (m2t, t2t, deleted, opened, _) = row.step(cur, fake.forward(cur), cfg, fake.MASK, fake.DELETE, fake.SPLIT)
        if tokens is None:
            break
        steps.append((sorted(m2t), sorted(t2t), deleted, opened, tokens))
        cur = tokens
    assert steps == expected(trace)


def test_budget_0_ends_the_block_in_the_step_filling_its_last_original_masks(model):
    """Budget 0 (ID-2): the step whose M2T takes the last original masks force-finishes; with budget
    1 the same step is an ordinary one and the block goes on (an edit-only round)."""
    lm, naive = model
    prompt = prompt_of(40, seed=40)
    zero, one = (reference(lm, naive, prompt, 0.9, 0.9, post, 32) for post in (0, 1))
    first = min(zero.ends)
    zero_steps, one_steps = ([s for s in tr.steps if s.block == first] for tr in (zero, one))
    n = len(zero_steps)
    assert zero.ends[first] == "forced" and zero_steps[-1].forced and len(one_steps) > n - 1
    assert [s.after for s in zero_steps[:-1]] == [s.after for s in one_steps[:n - 1]]
    assert not one_steps[n - 1].forced and one_steps[n - 1].committed[:1] == zero_steps[-1].committed[:1]


def test_batch_equals_rows_alone(model):
    lm, _ = model
    prompts = [prompt_of(n, seed=n) for n in (5, 40, 33)]
    batch = decode(lm, prompts, config())
    for row, prompt in enumerate(prompts):
        alone = decode(lm, [prompt], config())
        assert batch[0][row] == alone[0][0]
        assert batch[2].canvas[row, :alone[2].canvas.shape[1]].tolist() == alone[2].canvas[0].tolist()


def test_refusals(model, tmp_path):
    lm, _ = model
    with pytest.raises(Exception, match="indel: set edit_threshold"):
        DecodeConfig(indel=True)
    with pytest.raises(Exception, match="rule local_leap is not combined with it"):
        DecodeConfig(indel=True, edit_threshold=0.0, rule="local_leap")
    with pytest.raises(UserError, match="greedy"):
        run(lm.decoder, [prompt_of(5)], DecodeConfig(gen_len=32, indel=True, edit_threshold=0.0, temperature=0.5))
    plain = write_llada2_2(tmp_path / "no-edit-tokens")
    assert "delete_token_id" not in json.loads((plain / "config.json").read_text())
    with pytest.raises(UserError, match="names no delete_token_id"):
        run(loading.load(plain, dtype="fp64").decoder, [prompt_of(5)], config())


def test_view_redraws_the_block_and_counts_deletions_and_insertions():
    from io import StringIO
    from types import SimpleNamespace

    from rich.console import Console

    from fastdllm.terminal.view import LiveCanvas

    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=False: f"<{ids[0]}>")
    view = LiveCanvas(Console(file=StringIO(), width=80), tokenizer, "h", gen_len=4, block_len=4, stops=(0,))
    positions, no = torch.tensor([[0, 1, 2, 3]]), torch.zeros(1, 4, dtype=torch.bool)
    flags = lambda *v: torch.tensor([v]).bool()                                      # noqa: E731
    step = {"block": 0, "span": (0, 4), "positions": positions, "confidences": torch.full((1, 4), 0.9)}
    view.update(StepEvent(step=0, nfe=1, tokens=torch.tensor([[7, 8, 9, 99]]), committed=flags(1, 1, 1, 0), edited=no,
                          deleted=no, inserted=no, masks=flags(0, 0, 0, 1), **step))
    # DELETE written at 1: 9 shifts left, two masks follow
    view.update(StepEvent(step=1, nfe=2, tokens=torch.tensor([[7, 9, 99, 99]]), committed=no, edited=flags(0, 1, 0, 0),
                          deleted=flags(0, 1, 0, 0), inserted=no, masks=flags(0, 0, 1, 1), **step))
    assert view.tokens == [7, 9, None, None]
    # SPLIT written at 0: a mask opens before 7
    view.update(StepEvent(step=2, nfe=3, tokens=torch.tensor([[99, 7, 9, 99]]), committed=no, edited=flags(1, 0, 0, 0),
                          deleted=no, inserted=flags(1, 0, 0, 0), masks=flags(1, 0, 0, 1), **step))
    assert view.tokens == [None, 7, 9, None]
    assert "1 deleted · 1 inserted" in view.frame(view.render().renderables[1], 1).renderables[2].plain


def test_profile_and_cli(model):
    from cli_runner import invoke

    from fastdllm.decode import profiles
    from fastdllm.decode.family_defaults import default_profile

    lm, _ = model
    cfg = profiles.resolve(profiles.find("llada2.2"), {})
    assert (cfg.indel, cfg.threshold, cfg.edit_threshold, cfg.max_post_steps, cfg.cache) == (True, 0.5, 0.0, 16, "prefix")
    assert not profiles.resolve(profiles.find("llada2.2-no-indel"), {}).indel
    config = json.loads((lm.path / "config.json").read_text())
    assert default_profile(config) == "llada2.2"
    assert default_profile({k: v for k, v in config.items() if k != "delete_token_id"}) == "llada2"
    record = json.loads(invoke("generate", "-m", lm.path, "--json", "-n", "32", "--no-early-stop", "--raw", "hi").stdout)
    assert record["config"]["indel"] is True and record["nfe"] > 0


def test_bench_rows(model):
    """A LLaDA2.2 checkpoint gets the InDel row beside the editing rows; LLaDA2.1's does not."""
    from fastdllm.bench.cases import Sweep, expand, pick_rows, table_for

    lm, _ = model
    table = table_for(lm.path)
    assert {"indel", "edit-speed", "speed-no-edit"} <= set(table)
    cases = {c.name: c.cfg for c in expand(pick_rows(["indel", "edit-speed"], table=table), Sweep(gen_len=(64,)), lm.path)}
    assert cases["indel"].indel and cases["indel"] == replace(cases["edit-speed"], indel=True)
    from fastdllm.decode.rules import rule_fields, rule_text
    assert rule_text(rule_fields(cases["indel"])) == rule_text(rule_fields(cases["edit-speed"])) + " indel"
    assert "indel" not in table_for(write_llada2_2(lm.path.parent / "no-edit-tokens"))


def test_early_stop_after_the_block_where_the_answer_ends(model):
    """With early stop the decoding ends after the block holding the answer's end (finished blocks
    are final); the answer is the same as without it. This prompt's answer ends at offset 37."""
    lm, _ = model
    prompt = prompt_of(5, seed=105)
    full = run(lm.decoder, [prompt], config(gen_len=96))
    ends = [i for i, t in enumerate(full.canvas[0].tolist()) if t in lm.specials.stops]
    assert ends[0] == 37 and full.blocks_decoded == 4
    early = run(lm.decoder, [prompt], replace(config(gen_len=96), early_stop=True))
    assert early.ids == full.ids and early.blocks_decoded == 2 and early.early_stopped


def test_serve_takes_indel_per_request(model):
    """The request's `fastdllm` object (or the llada2.2 profile) turns InDel on; the scheduler's
    answers are each row's alone (it re-plans batches only at block ends)."""
    from fastdllm.serve.protocol import prepare_completion
    from fastdllm.serve.server import Server

    lm, _ = model
    server = Server(lm, DecodeConfig(gen_len=64, rule="dynamic", threshold=0.95), "llada2", {})
    body = {"model": lm.path.name, "prompt": prompt_of(9), "max_tokens": 64}
    assert prepare_completion({**body, "fastdllm": {"profile": "llada2.2"}}, server).cfg.indel
    cfg = prepare_completion({**body, "fastdllm": {"indel": True, "edit_threshold": 0.0, "threshold": 0.5,
                                                   "early_stop": False}}, server).cfg
    assert cfg.indel and cfg.edit_threshold == 0.0
    prompts = {f"r{n}": prompt_of(n, seed=n) for n in (9, 33, 40)}
    got = scheduler_answers(lm.decoder, prompts, cfg)
    for name, prompt in prompts.items():
        assert got[name].ids == run(lm.decoder, [prompt], cfg).ids[0]
