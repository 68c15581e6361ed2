"""iLLaDA (docs/specs/illada.md) on tiny random checkpoints in the layout its spec describes
(fastdllm/testing/tiny_illada.py), against the independent float64 transcription of its forward
and of its authors' generate / var_generate / end-of-thinking boost (tests/references/reference_illada.py):
committed tokens and NFE equal with the growing canvas on and off, a stop in the middle of a block,
the stop in the last block, steps < block_len, the boost with a one-id and a multi-id `</think>`
(the partial-prefix case); loading (tied head with and without lm_head.weight in the shards, an
untied one, dispatch by architecture name); every refusal of docs/specs/illada.md 8 in one line."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import pytest
import reference_illada as ref
import torch
from cli_runner import invoke
from one_line import one_line_refusal

from fastdllm.checkpoints import loading
from fastdllm.testing.tiny_illada import EOS_ID, MASK_ID, PAD_ID, write_illada
from fastdllm.decode import profiles
from fastdllm.decode.config import ConfigError, DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.errors import UserError

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("one_thread")]
PROMPT = [100, 7, 99, 150, 12, 13, 14]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("illada")
    return {"main": write_illada(root / "main", dtype=torch.float64),
            "bytes": write_illada(root / "bytes", dtype=torch.float64, seed=1, think_tokens=False),
            "head": write_illada(root / "head", dtype=torch.float64, store_head=True, sharded=True)}


@pytest.fixture(scope="module")
def models(folders):
    made = {}

    def get(name):
        if name not in made:
            made[name] = (loading.load(folders[name], dtype="fp64"), ref.NaiveILLaDA(folders[name]))
        return made[name]
    return get


def config(gen_len, block_len, per_block, var, **kw):
    return DecodeConfig(**{"gen_len": gen_len, "block_len": block_len, "block_steps": per_block, "rule": "fixed",
                           "cache": "none", "variable_length": var, **kw})


def authors(naive, prompt, gen_len, block_len, per_block, var, stops=(), think=None):
    """The transcription's generated tokens (prompt cut off) and forwards."""
    x = torch.tensor([prompt])
    if var:
        out, nfe = ref.var_generate(naive, x, steps=per_block, gen_length=gen_len, block_length=block_len,
                                    mask_id=MASK_ID, stops=stops, think=think)
    else:
        out, nfe = ref.fixed_generate(naive, x, steps=per_block * (gen_len // block_len), gen_length=gen_len,
                                      block_length=block_len, mask_id=MASK_ID, think=think)
    return out[0, len(prompt):].tolist(), nfe


def with_stops(lm, stops):
    return replace(lm.decoder, specials=replace(lm.specials, stops=tuple(stops)))


def check(lm, naive, cfg, stops=None, think=None):
    """The engine against the transcription: every decoded block's tokens and NFE equal."""
    decoder = lm.decoder if stops is None else with_stops(lm, stops)
    result = run(decoder, [PROMPT], cfg)
    expected, nfe = authors(naive, PROMPT, cfg.gen_len, cfg.block_len, cfg.steps_per_block, cfg.variable_length,
                            stops or (), think)
    decoded = result.blocks_decoded * cfg.block_len
    assert result.canvas[0, :decoded].tolist() == expected and len(expected) == decoded
    assert (result.canvas[0, decoded:] == MASK_ID).all() and result.nfe == nfe
    return result, expected


# --- the files and the forward -----------------------------------------------------------------------

def test_loads_in_the_spec_layout_with_a_tied_head(models, folders):
    lm, naive = models("main")
    assert (lm.family, lm.specials.mask, lm.specials.pad, lm.specials.stops) == ("illada", MASK_ID, PAD_ID, (EOS_ID,))
    assert lm.info["attention"] == "bidirectional" and lm.model.logit_shift == 0
    assert lm.model.output_head is None and lm.tokenizer.convert_ids_to_tokens(MASK_ID) == "<[MASK]>"
    assert lm.thought == (262, 263)                                   # <think> ... </think> left out of answers
    x = torch.tensor([PROMPT + [MASK_ID] * 9])
    with torch.no_grad():
        assert (lm.model(x).logits - naive.logits(x)).abs().max() < 1e-10


def test_a_stored_lm_head_changes_nothing_when_tied(models):
    lm, naive = models("head")
    assert lm.model.output_head is None                               # tied: the embedding is the head
    x = torch.tensor([PROMPT + [MASK_ID] * 5])
    with torch.no_grad():
        assert (lm.model(x).logits - models("main")[0].model(x).logits).abs().max() < 1e-10


def test_an_untied_head_is_read_and_a_missing_one_is_the_embedding(tmp_path):
    from safetensors.torch import load_file, save_file

    untied = write_illada(tmp_path / "untied", dtype=torch.float64, tie_word_embeddings=False, store_head=True)
    weights = load_file(str(untied / "model.safetensors"))
    weights["lm_head.weight"] = torch.randn_like(weights["lm_head.weight"])
    save_file(weights, str(untied / "model.safetensors"), metadata={"format": "pt"})
    lm = loading.load(untied, dtype="fp64")
    assert torch.equal(lm.model.output_head.weight, weights["lm_head.weight"])
    x = torch.tensor([PROMPT + [MASK_ID] * 3])
    with torch.no_grad():
        assert (lm.model(x).logits - ref.NaiveILLaDA(untied).logits(x)).abs().max() < 1e-10
    missing = write_illada(tmp_path / "missing", dtype=torch.float64, tie_word_embeddings=False)
    assert loading.load(missing, dtype="fp64").model.output_head is None


@pytest.mark.parametrize("model_type", ["llada", None])
def test_the_architecture_name_finds_the_family_whatever_the_model_type(tmp_path, model_type):
    folder = write_illada(tmp_path / "m", dtype=torch.float64, **({"model_type": model_type} if model_type else {}),
                          drop=() if model_type else ("model_type",))
    lm = loading.load(folder, dtype="fp64")
    assert lm.family == "illada" and type(lm.model).__name__ == "ILLaDAForCausalLM"
    assert any("read as 'illada'" in note for note in lm.notes)
    assert profiles.default_profile_for(folder) == "illada"


# --- decoding against the authors' algorithm ------------------------------------------------------------

def test_the_growing_canvas_decodes_otherwise_than_the_full_one(models):
    lm, _ = models("main")
    on, off = (run(lm.decoder, [PROMPT], config(32, 8, 8, var, early_stop=False)) for var in (True, False))
    assert on.canvas[0, :8].tolist() != off.canvas[0, :8].tolist()  # the future masks were seen, or not


def first_new(tokens: list[int], lo: int, hi: int) -> tuple[int, int]:
    """(offset, token): the first token in tokens[lo:hi] that no earlier offset holds."""
    for i in range(lo, hi):
        if tokens[i] not in tokens[:i]:
            return i, tokens[i]
    raise AssertionError(f"no new token in [{lo}, {hi})")


@pytest.mark.parametrize("per_block", [8, 4])
def test_a_stop_in_the_middle_of_a_block_ends_decoding_after_it(models, per_block):
    lm, naive = models("main")
    full, _ = authors(naive, PROMPT, 32, 8, per_block, True)
    at, stop = first_new(full, 11, 14)                              # inside block 1 (offsets 8-15)
    result, expected = check(lm, naive, config(32, 8, per_block, True), stops=[stop])
    assert result.blocks_decoded == 2 and result.nfe == 2 * per_block and result.early_stopped
    assert result.ids[0] == expected[:at] == full[:at]               # the answer cut at the stop


def test_a_stop_in_the_last_block_decodes_every_block(models):
    lm, naive = models("main")
    full, _ = authors(naive, PROMPT, 32, 8, 8, True)
    at, stop = first_new(full, 24, 32)
    result, _ = check(lm, naive, config(32, 8, 8, True), stops=[stop])
    assert result.blocks_decoded == 4 and result.nfe == 32 and result.ids[0] == full[:at]


@pytest.mark.parametrize("var", [True, False])
@pytest.mark.parametrize("name, boost, power", [("main", 30.0, 2.0), ("main", 200.0, 1.0), ("bytes", 400.0, 1.0),
                                                ("bytes", 60.0, 3.0)])
def test_the_end_think_boost_as_the_authors(models, name, boost, power, var):
    lm, naive = models(name)
    S = lm.decoder.encode("</think>")
    assert len(S) == (1 if name == "main" else 8)                    # one token, or eight bytes
    per_block = 8 if boost >= 200 else 4                             # strong: one token a step, p first
    cfg = config(32, 8, per_block, var, early_stop=False, end_think_boost=boost, end_think_power=power)
    result, expected = check(lm, naive, cfg, think=dict(ids=S, boost=boost, power=power))
    if boost >= 200:                                                 # the whole run is written, by its
        assert ref.holds(expected, S)                                # prefixes for the bytes
    plain, _ = authors(naive, PROMPT, 32, 8, per_block, var)
    assert plain != expected                                         # the boost changed the answer


def test_var_with_the_caches_runs_and_counts_its_forwards(models):
    lm, _ = models("main")
    for cache in ("prefix", "dual"):
        result = run(lm.decoder, [PROMPT], replace(config(32, 8, 4, True, early_stop=False), cache=cache))
        assert result.nfe == 16 and not (result.canvas == MASK_ID).any()


def test_unpadded_rows_share_a_batch_and_decode_as_alone(models):
    lm, _ = models("main")
    cfg = config(16, 8, 8, True, early_stop=False)
    other = [3 + t for t in PROMPT[::-1]]
    both = run(lm.decoder, [PROMPT, other], cfg)
    assert both.canvas.tolist() == [run(lm.decoder, [p], cfg).canvas[0].tolist() for p in (PROMPT, other)]


def test_profiles_resolve_the_authors_settings(folders):
    base = profiles.resolve(profiles.find("illada"), {}, folders["main"])
    assert (base.variable_length, base.block_len, base.steps_per_block, base.gen_len, base.cache, base.rule) == \
        (True, 32, 32, 1024, "none", "fixed")
    instruct = profiles.resolve(profiles.find("illada-instruct"), {}, folders["main"])
    assert (instruct.gen_len, instruct.end_think_boost, instruct.end_think_power) == (2048, 100.0, 3.0)
    flagged = profiles.resolve(profiles.find("illada"), {"steps": "64"}, folders["main"])
    assert flagged.block_steps is None and flagged.steps_per_block == 2        # a later layer's count wins
    generic = profiles.resolve(profiles.find("default"), {}, folders["main"])
    assert generic.variable_length and generic.block_len == 32                # the family's defaults


# --- refusals (docs/specs/illada.md 8) ----------------------------------------------------------------------

def _edited(folder, tmp_path, config=None, tokenizer=None):
    path = shutil.copytree(folder, tmp_path / "edited")
    if config:
        raw = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**raw, **config}))
    if tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (path / name).write_text((path / name).read_text().replace(*tokenizer))
    return path


@pytest.mark.parametrize("config, tokenizer, message", [
    (None, ("<[MASK]>", "<|mask|>"), "iLLaDA: mask token `<[MASK]>` (id 5) not found (the tokenizer's id 5 is '<|mask|>')"),
    ({"mask_token_id": 7}, None, "iLLaDA: mask token `<[MASK]>` (id 7) not found"),
    ({"layer_norm_eps": 1e-5}, None, "config.json sets layer_norm_eps=1e-05 (LayerNorm with biases"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, None, "config.json sets rope_scaling="),
    ({"attention_bias": True}, None, "config.json sets attention_bias=True (biases on q, k, v and o)"),
    ({"mlp_bias": True}, None, "config.json sets mlp_bias=True (biases on the MLP)"),
    ({"hidden_act": "gelu"}, None, "config.json sets hidden_act='gelu'"),
])
def test_a_checkpoint_beyond_the_spec_is_refused_in_one_line(folders, tmp_path, config, tokenizer, message):
    path = _edited(folders["main"], tmp_path, config, tokenizer)
    one_line_refusal(lambda: loading.load(path, dtype="fp64"), message)


def test_a_config_without_the_unknown_constants_is_refused(tmp_path):
    path = write_illada(tmp_path / "m", dtype=torch.float64, drop=("rope_theta",))
    one_line_refusal(lambda: loading.load(path), "config.json has no rope_theta (the rotary base, not known for iLLaDA)")


def test_padded_batches_are_refused_and_serve_decodes_such_rows_alone(models):
    from fastdllm.serve.jobs import Job
    from fastdllm.serve.rows import Row, batch_key, fits

    lm, _ = models("main")
    cfg = config(16, 8, 8, True)
    one_line_refusal(lambda: run(lm.decoder, [PROMPT, PROMPT[:3]], cfg),
                     "iLLaDA: padded batches are not the authors' path (batch 1)")
    jobs = [Job(str(i), p, cfg, deliver=lambda u: None) for i, p in enumerate((PROMPT, PROMPT[:3]))]
    assert not fits(lm.decoder, [Row(j, lm.decoder) for j in jobs], batch_key(jobs[0]))


def test_serve_decodes_rows_of_other_lengths_one_at_a_time_each_as_alone(models):
    import threading

    from fastdllm.serve.jobs import Failed, Finished, Job
    from fastdllm.serve.scheduler import Scheduler

    lm, _ = models("main")
    cfg = config(24, 8, 4, True)
    prompts = [PROMPT, PROMPT[:3], PROMPT[2:]]
    done, results = threading.Condition(), {}

    def deliver(name, update):
        if isinstance(update, (Finished, Failed)):
            with done:
                results[name] = update
                done.notify_all()
    sched = Scheduler(lm.decoder, max_batch=4)
    sched.start()
    try:
        for i, p in enumerate(prompts):
            sched.submit(Job(str(i), p, cfg, deliver=lambda u, n=str(i): deliver(n, u)))
        with done:
            assert done.wait_for(lambda: len(results) == len(prompts), 120)
    finally:
        sched.shutdown(10)
    for i, p in enumerate(prompts):
        assert isinstance(results[str(i)], Finished) and results[str(i)].ids == run(lm.decoder, [p], cfg).ids[0]


def test_serve_refuses_a_plain_transcript_chat(models):
    from fastdllm.serve.protocol import prepare_chat
    from fastdllm.serve.errors import ApiError
    from fastdllm.serve.server import Server

    lm, _ = models("main")
    server = Server(lm, config(16, 8, 8, True), "illada", {})
    with pytest.raises(ApiError, match="iLLaDA: chat needs the checkpoint's chat template") as err:
        prepare_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, server)
    assert err.value.status == 400 and "\n" not in str(err.value)


def test_settings_the_growing_canvas_cannot_honour_are_refused(models):
    lm, _ = models("main")
    for kw, message in ((dict(prophet=True, answer_anchor="3:x"), "variable_length: not combined with prophet"),
                        (dict(dpad_window=8), "variable_length: not combined with dpad"),
                        (dict(cache="dkv"), "variable_length: not combined with cache dkv")):
        one_line_refusal(lambda: config(32, 8, 8, True, **kw), message, ConfigError)
    one_line_refusal(lambda: DecodeConfig(gen_len=32, steps=8, block_steps=2), "set one", ConfigError)
    one_line_refusal(lambda: run(lm.decoder, [PROMPT], config(16, 8, 8, True, batch_invariant=True)),
                     "batch_invariant: not implemented with variable_length")


def test_through_the_cli_generate_info_and_the_chat_refusal(folders):
    folder = folders["main"]
    record = json.loads(invoke("generate", "-m", folder, "--json", "-n", "16", "--block-len", "8", "--block-steps", "4",
                               "hello").stdout)
    assert record["profile"] == "illada" and record["config"]["variable_length"] and record["nfe"] <= 8
    info = invoke("info", folder, env={"COLUMNS": "200"}).stdout
    assert re.search(r"variant\s+iLLaDA \(LLaDA's successor", info)
    too_many = invoke("generate", "-m", folder, "-n", "16", "--block-len", "8", "hello")
    assert too_many.exit_code == 2 and "block_steps 32 exceeds block_len 8" in too_many.stderr
    chat = invoke("chat", "-m", folder, "-n", "16", "--block-len", "8", "--block-steps", "8", input="hi\n/bye\n")
    assert chat.exit_code == 1 and len(chat.stderr.strip().splitlines()) == 1
    assert "iLLaDA: chat needs the checkpoint's chat template" in chat.stderr
    with pytest.raises(UserError, match="no tokenizer that encodes"):
        run(replace(models_decoder := loading.load(folder, dtype="fp64").decoder, encode=None), [PROMPT],
            config(16, 8, 8, True, end_think_boost=1.0))
    assert models_decoder.encode("</think>") == [263]
