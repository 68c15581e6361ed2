"""Nemotron-Labs Diffusion (docs/specs/nemotron-diffusion.md): the tiny checkpoint in the published layout,
its loading and config guard, and float64 logits of both attention modes against an independent
transcription of the reference forward (tests/references/reference_nemotron.py) and, causal, against
transformers' own Ministral-3. Positions run past original_max_position_embeddings (16 in the tiny
config) so that YaRN and the Llama-4 query scale both matter."""

from __future__ import annotations

import json

import pytest
import torch
import reference_nemotron as ref
from safetensors.torch import load_file

from fastdllm.checkpoints.loading import load
from fastdllm.testing.tiny_nemotron import EOS_ID, MASK_ID, nemotron_config, write_nemotron
from fastdllm.errors import UserError
from fastdllm.models.kv_cache import CanvasCache
from fastdllm.models.nemotron_labs_diffusion import ROPE_8B, rope_frequencies

pytestmark = pytest.mark.usefixtures("one_thread")          # tests/conftest.py
PROMPT = torch.randint(1000, 1256, (2, 41), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def tiny_dir(tiny):
    return tiny("nemotron", dtype=torch.float32)


@pytest.fixture(scope="module")
def lm(tiny_dir):
    return load(tiny_dir, dtype="fp64", device="cpu")


@pytest.fixture(scope="module")
def naive(tiny_dir):
    return ref.load(tiny_dir)


def test_published_layout(tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text())
    assert list(config) == sorted(nemotron_config()) and config["model_type"] == "nemotron_labs_diffusion"
    assert (config["mask_token_id"], config["eos_token_id"], config["block_size"]) == (100, 11, 32)
    index = json.loads((tiny_dir / "model.safetensors.index.json").read_text())["weight_map"]
    names = set(index)
    assert {"encoder.embed_tokens.weight", "encoder.norm.weight", "diffusion_head.weight",
            "encoder.layers.1.self_attn.o_proj.weight", "encoder.layers.0.mlp.down_proj.weight"} <= names
    assert not any(n.startswith("model.") or "lm_head" in n or n.endswith(".bias") for n in names)
    stored = set()
    for f in set(index.values()):
        stored |= set(load_file(str(tiny_dir / f)))
    assert stored == names


def test_loads_with_specials(lm):
    assert lm.info["family"] == "nemotron_labs_diffusion" and lm.model.sampler == "seeded"
    assert lm.specials.mask == MASK_ID and lm.specials.stops == (EOS_ID,)
    assert lm.tokenizer.decode(lm.tokenizer("héllo, wörld")["input_ids"]) == "héllo, wörld"


@pytest.mark.parametrize("change, key", [({"dlm_paradigm": "block_diff"}, "dlm_paradigm"),
                                         ({"tie_word_embeddings": True}, "tie_word_embeddings"),
                                         ({"hidden_act": "gelu"}, "hidden_act")])
def test_guard_refuses(tiny_dir, tmp_path, change, key):
    out = write_nemotron(tmp_path / "m", dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    config.update(change)
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=key):
        load(out, dtype="fp64", device="cpu")


@pytest.mark.parametrize("rope", [ROPE_8B, {**ROPE_8B, "original_max_position_embeddings": 16},
                                  {**ROPE_8B, "mscale": 0.7, "truncate": False},
                                  {"rope_type": "default", "rope_theta": 1e6}])
def test_rope_frequencies_match_transformers(rope):
    cfg = {**nemotron_config(), "rope_parameters": rope}
    theirs, factor = ref.inv_freq(cfg)
    ours, our_factor = rope_frequencies(rope, 128)
    assert torch.equal(ours, theirs.float()) and our_factor == pytest.approx(factor, rel=1e-15)


def _cache(lm, T, B=2):
    model = lm.model
    return model.new_cache(torch.ones(B, T, dtype=torch.bool))


def test_logits_both_modes_against_reference(lm, naive):
    """Prefill 41 causal, then a block of 8 bidirectional against it at positions 41..48, then its
    causal commit: float64 logits equal the transcription's to 1e-10 (positions past 16 and 32)."""
    W, cfg = naive
    model, block = lm.model, torch.randint(1000, 1256, (2, 8), generator=torch.Generator().manual_seed(4))
    block[:, 2:] = MASK_ID
    cache = _cache(lm, 49)
    theirs: list = []
    with torch.inference_mode():
        ours = model.encode_all(PROMPT, 0, cache)
        expected = ref.forward(W, cfg, PROMPT, theirs, causal=True, keep=True)
        torch.testing.assert_close(ours, expected, rtol=0, atol=1e-10)
        torch.testing.assert_close(model.encode(PROMPT, 0, cache), expected[:, -1], rtol=0, atol=1e-10)
        for _ in range(2):          # a denoise step's K/V never leak into the next one
            torch.testing.assert_close(model.denoise(block, 41, cache), ref.forward(W, cfg, block, theirs, False, False),
                                       rtol=0, atol=1e-10)
        torch.testing.assert_close(model.encode_all(block, 41, cache), ref.forward(W, cfg, block, theirs, True, True),
                                   rtol=0, atol=1e-10)
        full = torch.cat([PROMPT, block], 1)
        torch.testing.assert_close(model(full).logits, ref.forward(W, cfg, full, [], False, False), rtol=0, atol=1e-10)


def test_query_scale_and_yarn_matter(lm, naive):
    """The comparison above would fail without either: drop the query scale, or use plain RoPE."""
    W, cfg = naive
    plain = {**cfg, "rope_parameters": {**cfg["rope_parameters"], "llama_4_scaling_beta": 0.0}}
    default = {**cfg, "rope_parameters": {**cfg["rope_parameters"], "rope_type": "default"}}
    with torch.inference_mode():
        ours = lm.model.encode_all(PROMPT, 0, _cache(lm, 41))
        for other in (plain, default):
            assert (ours - ref.forward(W, other, PROMPT, [], True, False)).abs().max() > 1e-3


def test_causal_matches_transformers_ministral3(lm, naive, tiny_dir):
    """transformers' Ministral3ForCausalLM on the same weights (encoder. -> model., diffusion_head ->
    lm_head) gives the causal logits."""
    from transformers.models.ministral3 import Ministral3Config, Ministral3ForCausalLM

    W, cfg = naive
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "rms_norm_eps", "max_position_embeddings")
    tc = Ministral3Config(**{k: cfg[k] for k in keys}, rope_parameters=dict(cfg["rope_parameters"]),
                          tie_word_embeddings=False)
    hf = Ministral3ForCausalLM(tc).double().eval()
    state = {k.replace("encoder.", "model.").replace("diffusion_head", "lm_head"): v for k, v in W.items()}
    assert not hf.load_state_dict(state, strict=False).missing_keys
    with torch.inference_mode():
        theirs = hf(PROMPT).logits
        ours = lm.model.encode_all(PROMPT, 0, _cache(lm, 41))
    # their cos/sin and query scale are fp32 even in a float64 model: agreement to ~1e-6 of the logits' range
    assert (ours - theirs).abs().max() < 2e-6 * theirs.abs().max()
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_left_padding_keeps_positions(lm):
    """A row padded on the left gives the logits it gives alone (positions and query scale per row)."""
    model = lm.model
    short = PROMPT[1:, 5:]
    padded = torch.cat([torch.full((1, 5), EOS_ID), short], 1)
    valid = torch.ones(1, 41, dtype=torch.bool)
    valid[0, :5] = False
    with torch.inference_mode():
        alone = model.encode_all(short, 0, model.new_cache(torch.ones(1, 36, dtype=torch.bool)))
        inside = model.encode_all(padded, 0, model.new_cache(valid))[:, 5:]
    torch.testing.assert_close(inside, alone, rtol=0, atol=1e-10)
    assert isinstance(model.new_cache(valid), CanvasCache)
