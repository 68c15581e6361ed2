"""Steerling (docs/specs/steerling.md): the Hub layout loads (tiny random weights, small cl100k-format
rank file), the forward equals an independent transcription, and `fastdllm` decodes as the
authors' generate_full: tokens, NFE and stop equal in float64 against tests/references/reference_steerling.py
(prompts of lengths off the block grid, blocks of 8 and 64, steps per block 1..8, greedy, entropy
and top-p sampling, repetition penalty on and off, a block stop at <|endofchunk|> mid-block, the
instruct model's <|eot_id|> mid-step, prefix cache and none)."""

from __future__ import annotations

import json

import pytest
import torch

from fastdllm.checkpoints.loading import load
from fastdllm.testing.tiny_steerling import ENDOFCHUNK, EOT, write_steerling
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import generate
from fastdllm.errors import UserError

import reference_steerling as ref
from steerling_trace import ENTROPY, GREEDY, PROMPTS, TOP_P, ours, steered_row


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("steerling")
    base = write_steerling(root / "base", dtype=torch.float64)
    found = {"base": base,
             "grid64": write_steerling(root / "grid64", dtype=torch.float64, seed=1, diff_block_size=64,
                                       clip_qkv=None, intermediate_size=None, weight_sharing=False, sharded=True),
             "clamped": write_steerling(root / "clamped", dtype=torch.float64, seed=2, qkv_scale=12.0)}
    found["chunky"] = _with_row(root / "chunky", base, ENDOFCHUNK, 0.9)     # scanned: a stop mid-run
    instruct = write_steerling(root / "instruct", dtype=torch.float64, instruct=True, seed=3)
    found["instruct"] = write_steerling(root / "instruct", dtype=torch.float64, instruct=True, seed=3,
                                        eot_row=steered_row(instruct, EOT, 1.2))      # scanned: EOT in block 1
    return found


def _with_row(out, base, token, scale):
    """The base checkpoint with `token`'s embedding row steered (weights otherwise the same)."""
    from safetensors.torch import load_file, save_file

    out = write_steerling(out, dtype=torch.float64)
    w = load_file(str(out / "model.safetensors"))
    w["transformer.tok_emb.weight"][token] = steered_row(base, token, scale)
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _theirs(folder, prompt, cfg: DecodeConfig, stop_tokens=(), eot_id=None):
    return ref.generate_full(folder, prompt, max_new_tokens=cfg.gen_len, steps=cfg.steps, temperature=cfg.temperature,
                             top_p=cfg.top_p, repetition_penalty=cfg.repetition_penalty,
                             entropy_sampling=cfg.entropy_sampling, seed=cfg.seed, stop_tokens=stop_tokens,
                             eot_id=eot_id)


def test_logits_equal_the_transcription(folders):
    for name in ("base", "grid64", "clamped"):
        folder = folders[name]
        c = json.loads((folder / "config.json").read_text())
        ids = PROMPTS[9] + [c["mask_token_id"]] * 13 + PROMPTS[3]
        lm = load(folder, dtype="fp64")
        ours = lm.model(torch.tensor([ids])).logits[0]
        theirs = ref.logits(ref.load_tensors(folder), c, ids)
        assert (ours - theirs).abs().max() < 1e-10, name


CASES = [(L, gen, steps, sampling, rp, cache)
         for L, gen, steps, sampling, rp, cache in [
             (3, 8, None, GREEDY, 1.1, "prefix"), (8, 24, None, GREEDY, 1.0, "prefix"),
             (9, 24, 6, GREEDY, 1.1, "none"), (15, 16, 4, ENTROPY, 1.1, "prefix"),
             (9, 24, None, ENTROPY, 1.0, "prefix"), (3, 16, 16, TOP_P, 1.1, "none"),
             (15, 24, 3, TOP_P, 1.1, "prefix"), (8, 8, 1, ENTROPY, 1.1, "prefix")]]


@pytest.mark.parametrize("L, gen, steps, sampling, rp, cache", CASES)
def test_generate_as_the_authors(folders, L, gen, steps, sampling, rp, cache):
    cfg = DecodeConfig(gen_len=gen, block_len=8, steps=steps, rule="fixed", cache=cache, repetition_penalty=rp,
                       seed=7, early_stop=False, **sampling)
    result, events = ours(folders["base"], [PROMPTS[L]], **{k: getattr(cfg, k) for k in (
        "gen_len", "steps", "cache", "repetition_penalty", "seed", "early_stop", "entropy_sampling", "temperature",
        "top_p")})
    theirs = _theirs(folders["base"], PROMPTS[L], cfg)
    assert result.canvas[0].tolist() == theirs["canvas"]
    assert result.ids[0] == theirs["tokens"]
    assert result.nfe == theirs["nfe"] == cfg.total_steps


@pytest.mark.parametrize("L", [3, 9])
def test_blocks_of_64_and_an_untied_head(folders, L):
    result, _ = ours(folders["grid64"], [PROMPTS[L]], gen_len=64, steps=16, repetition_penalty=1.1, **ENTROPY)
    theirs = ref.generate_full(folders["grid64"], PROMPTS[L], max_new_tokens=64, steps=16, **ENTROPY, seed=0)
    assert result.canvas[0].tolist() == theirs["canvas"] and result.nfe == theirs["nfe"] == 16


@pytest.mark.parametrize("cache", ["prefix", "none"])
def test_a_stop_token_ends_the_answer_after_its_block(folders, cache):
    folder = folders["chunky"]
    result, events = ours(folder, [PROMPTS[15]], gen_len=40, cache=cache, seed=0, repetition_penalty=1.1, **ENTROPY)
    theirs = ref.generate_full(folder, PROMPTS[15], max_new_tokens=40, stop_tokens=[ENDOFCHUNK], seed=0, **ENTROPY)
    at = theirs["canvas"].index(ENDOFCHUNK)
    assert theirs["stop"] == "stop" and theirs["nfe"] == 16 and at // 8 == 1 and at % 8 not in (0, 7)
    assert result.canvas[0].tolist() == theirs["canvas"] and result.ids[0] == theirs["tokens"]
    assert result.nfe == theirs["nfe"] and result.early_stopped


@pytest.mark.parametrize("cache", ["prefix", "none"])
def test_the_instruct_end_of_turn_stops_mid_step(folders, cache):
    folder = folders["instruct"]
    result, _ = ours(folder, [PROMPTS[15]], gen_len=32, steps=16, cache=cache, repetition_penalty=1.1, **ENTROPY)
    theirs = ref.generate_full(folder, PROMPTS[15], max_new_tokens=32, steps=16, eot_id=EOT, seed=0, **ENTROPY)
    assert theirs["stop"] == "eot" and theirs["nfe"] == 5 and theirs["canvas"].index(EOT) == 9
    assert result.canvas[0].tolist() == theirs["canvas"] and result.ids[0] == theirs["tokens"]
    assert result.nfe == theirs["nfe"] and result.texts[0] == load(folder).tokenizer.decode(theirs["tokens"])


def test_a_batch_of_one_length_decodes_each_row_as_alone(folders):
    prompts = [PROMPTS[9], PROMPTS[9][::-1]]
    together, _ = ours(folders["base"], prompts, gen_len=16, **ENTROPY)
    for row, prompt in enumerate(prompts):
        alone, _ = ours(folders["base"], [prompt], gen_len=16, **ENTROPY)
        assert together.canvas[row].tolist() == alone.canvas[0].tolist()


@pytest.mark.parametrize("decode, message", [
    (dict(block_len=16), "diff_block_size 8"), (dict(rule="threshold"), "authors' rule"),
    (dict(cache="dual"), "cache dual"), (dict(gen_len=256), "exceeds the context")])
def test_what_generate_full_does_not_do_is_refused_in_one_line(folders, decode, message):
    lm = load(folders["base"], dtype="fp64")
    cfg = DecodeConfig(**{"gen_len": 16, "block_len": 8, "rule": "fixed", "cache": "prefix", **decode})
    with pytest.raises(UserError, match=message):
        list(generate(lm.decoder, [PROMPTS[9] * 2], cfg))
    with pytest.raises(UserError, match="one prompt length"):
        list(generate(lm.decoder, [PROMPTS[3], PROMPTS[8]], DecodeConfig(gen_len=16, block_len=8, rule="fixed", cache="prefix")))


@pytest.mark.parametrize("key, value", [("norm_order", "pre"), ("mlp_type", "standard"), ("use_bias", True),
                                        ("use_epsilon_correction", False)])
def test_switches_beyond_the_8b_are_refused_by_name(tmp_path, key, value):
    folder = write_steerling(tmp_path / "m", **{key: value})
    with pytest.raises(UserError, match=key):
        load(folder)


def test_the_tokenizer_is_tiktokens_encoding(folders):
    tiktoken = pytest.importorskip("tiktoken")
    from fastdllm.checkpoints.tiktoken_files import ENCODINGS, read_ranks

    folder = folders["instruct"]
    ranks = read_ranks(folder / "cl100k_base.tiktoken")
    theirs = tiktoken.Encoding("tiny", pat_str=ENCODINGS["cl100k_base"]["pattern"], mergeable_ranks=ranks,
                               special_tokens={"<|endoftext|>": 281})
    tokenizer = load(folder).tokenizer
    for text in ["the cat is on the mat and the dog", "  Hello\n\n  world  ", "it's 12345 thinking!!\r\n",
                 "héllo wörld ☃ the", "Then\tthe end.   "]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == theirs.encode(text, disallowed_special=()) and tokenizer.decode(ids) == text
    assert tokenizer.convert_tokens_to_ids(["<|mask|>", "<|eot_id|>", "<|endoftext|>"]) == [285, EOT, 281]


def test_a_missing_rank_file_is_one_line(folders, tmp_path, monkeypatch):
    folder = write_steerling(tmp_path / "m")
    (folder / "cl100k_base.tiktoken").unlink()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    with pytest.raises(UserError, match="downloads nothing"):
        load(folder)


def test_generate_chat_and_info_through_the_cli(folders):
    from cli_runner import invoke

    folder = folders["instruct"]
    record = json.loads(invoke("generate", "-m", str(folder), "--json", "-n", "16", "hello there").stdout)
    cfg = record["config"]
    assert record["profile"] == "steerling" and (cfg["block_len"], cfg["rule"], cfg["cache"]) == (8, "fixed", "prefix")
    assert (cfg["entropy_sampling"], cfg["top_p"], cfg["repetition_penalty"], cfg["seed"]) == (True, 0.8, 1.1, 42)
    r = invoke("generate", "-m", str(folder), "-n", "16", "--rule", "threshold", "hi")
    assert r.exit_code == 1 and "authors' rule" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    info = json.loads(invoke("info", str(folder), "--json").stdout)
    assert (info["family"], info["mask_id"], info["eot_id"] if "eot_id" in info else EOT) == ("steerling", 285, EOT)
