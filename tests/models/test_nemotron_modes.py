"""Nemotron-Labs Diffusion's other two decoders (decode/speculative.py) against float64
transcriptions of the checkpoint's `ar_generate` and `linear_spec_generate` (tests/references/reference_nemotron.py):
tokens, NFE, and for self-speculation the drafts of every round and how many each round accepts,
with the linear_spec_lora adapter in PEFT's layout on the drafts only. The fixture favours a few
tokens (tiny_nemotron's `favoured`) so that drafts sometimes agree and rounds accept more than one."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import reference_nemotron as ref
from helpers import BYTE_IDS, prompt_of, upto_stop

from fastdllm.checkpoints.loading import load
from fastdllm.testing.tiny_nemotron import TINY, write_adapter, write_nemotron
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import generate
from fastdllm.decode.events import BlockEvent, Result, StepEvent
from fastdllm.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")          # tests/conftest.py
L, G = 8, 32


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = write_nemotron(tmp_path_factory.mktemp("nemotron") / "tiny", dtype=torch.float32, block_size=L,
                         favoured=2, favour_scale=8.0)
    write_adapter(out, n_layers=TINY["num_hidden_layers"], hidden_size=TINY["hidden_size"],
                  q_out=TINY["num_attention_heads"] * TINY["head_dim"], r=8, alpha=32, dtype=torch.float32)
    return out


@pytest.fixture(scope="module")
def lm(tiny_dir):
    return load(tiny_dir, dtype="fp64", device="cpu")


@pytest.fixture(scope="module")
def naive(tiny_dir):
    W, cfg = ref.load(tiny_dir)
    return W, cfg, ref.load_lora(tiny_dir)


def decode(decoder, prompts, **kw):
    events = list(generate(decoder, prompts, DecodeConfig(gen_len=G, block_len=L, cache="prefix", **kw)))
    return [e for e in events if not isinstance(e, Result)], events[-1]


def test_adapter_layout(tiny_dir):
    config = json.loads((tiny_dir / "linear_spec_lora" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["target_modules"] == ["o_proj"]
    assert (tiny_dir / "linear_spec_lora" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("n", [16, 21, 37])
def test_ar_generate(lm, naive, n):
    W, cfg, _ = naive
    _, result = decode(lm.decoder, [prompt_of(n, **BYTE_IDS)], mode="ar")
    out, nfe = ref.ar_generate(W, cfg, torch.tensor([prompt_of(n, **BYTE_IDS)]), G)
    assert result.ids[0] == upto_stop(out[0, n:].tolist(), cfg["eos_token_id"])
    assert result.nfe == nfe == G


def test_ar_batch_rows_equal_rows_alone(lm):
    prompts = [prompt_of(16, **BYTE_IDS), prompt_of(21, **BYTE_IDS), prompt_of(9, **BYTE_IDS)]
    _, batched = decode(lm.decoder, prompts, mode="ar")
    for r, p in enumerate(prompts):
        assert batched.ids[r] == decode(lm.decoder, [p], mode="ar")[1].ids[0]


@pytest.mark.parametrize("n", [16, 21, 37])
@pytest.mark.parametrize("rule, threshold", [("fixed", 0.0), ("threshold", 0.3)])
def test_self_spec_round_by_round(lm, naive, n, rule, threshold):
    W, cfg, lora = naive
    events, result = decode(lm.decoder, [prompt_of(n, **BYTE_IDS)], mode="self_spec", rule=rule, threshold=threshold or 0.9)
    out, nfe, trace = ref.linear_spec_generate(W, cfg, torch.tensor([prompt_of(n, **BYTE_IDS)]), G, L, threshold, lora)
    assert result.ids[0] == upto_stop(out[0, n:].tolist(), cfg["eos_token_id"])[:G]
    assert result.nfe == nfe
    rounds = [e for e in events if isinstance(e, BlockEvent)]
    assert [e.end - e.start for e in rounds] == [a for _, a in trace][:len(rounds)]
    # the drafted block each round verified: the last draft step's block, as the reference's
    drafts = [e for e in events if isinstance(e, StepEvent) and e.step >= 0 and not bool(e.committed.any())]
    if rule == "fixed":                         # one draft forward fills every mask
        assert len(drafts) == len(trace)
        assert [d.tokens[0, 1:].tolist() for d in drafts] == [b[0, 1:].tolist() for b, _ in trace]


def test_self_spec_accepts_several_and_the_adapter_matters(lm, naive):
    W, cfg, lora = naive
    _, _, trace = ref.linear_spec_generate(W, cfg, torch.tensor([prompt_of(21, **BYTE_IDS)]), G, L, 0.0, lora)
    assert max(a for _, a in trace) > 1                    # drafts were kept, not only bonus tokens
    _, _, plain = ref.linear_spec_generate(W, cfg, torch.tensor([prompt_of(21, **BYTE_IDS)]), G, L, 0.0, None)
    assert [b.tolist() for b, _ in plain] != [b.tolist() for b, _ in trace]
    lm.model.lora, kept = None, lm.model.lora
    try:
        events, _ = decode(lm.decoder, [prompt_of(21, **BYTE_IDS)], mode="self_spec", rule="fixed")
    finally:
        lm.model.lora = kept
    assert [e.end - e.start for e in events if isinstance(e, BlockEvent)] == [a for _, a in plain][:len(plain)]


def test_self_spec_stops_at_the_first_stop(lm, naive):
    W, cfg, lora = naive
    _, first = decode(lm.decoder, [prompt_of(21, **BYTE_IDS)], mode="self_spec", rule="fixed")
    stop = first.ids[0][10]
    out, nfe, _ = ref.linear_spec_generate(W, {**cfg, "eos_token_id": stop}, torch.tensor([prompt_of(21, **BYTE_IDS)]), G, L, 0.0, lora)
    decoder = replace(lm.decoder, specials=replace(lm.decoder.specials, stops=(stop,)))
    _, result = decode(decoder, [prompt_of(21, **BYTE_IDS)], mode="self_spec", rule="fixed")
    assert result.ids[0] == upto_stop(out[0, 21:].tolist(), stop) and result.nfe == nfe
    assert len(result.ids[0]) < 10 + 1


def test_self_spec_is_one_prompt_at_a_time(lm):
    with pytest.raises(UserError, match="one prompt at a time"):
        decode(lm.decoder, [prompt_of(5, **BYTE_IDS), prompt_of(6, **BYTE_IDS)], mode="self_spec")
