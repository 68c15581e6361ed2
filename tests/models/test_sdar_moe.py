"""SDAR-30B-A3B (`sdar_moe`) against the independent float64 transcription of its forward
(tests/references/reference_sdar_moe.py) and dense SDAR's reference decoder (tests/references/reference_blockdiff.py), on
tiny checkpoints in the published layout (fastdllm/testing/tiny_sdar_moe.py): the published
files as a download brings them, logits and every layer's router decisions, committed (position,
token) pairs at every step and NFE for each SDAR rule under both exact cache modes, a batch, the CLI
and `fastdllm info`, 8/4-bit on CPU, one-line errors."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import reference_blockdiff as ref
import torch
from cli_runner import invoke
from helpers import QWEN_IDS, prompt_of
from block_families import SDAR_MOE, block_steps, sdar_moe_checkpoints
from moe_trace import our_logits

from fastdllm.checkpoints import loading
from fastdllm.testing.tiny_sdar_moe import (
    COPIED,
    MASK_ID,
    PUBLISHED_DIR,
    published_config,
    write_sdar_moe,
)
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.errors import UserError
from fastdllm.models.moe import Router, Routing

# The published folder without weights, where this checkout has it (../shared next to the repository).
SHARED = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "published" / "JetLM__SDAR-30B-A3B-Chat"
# JetLM/SDAR-30B-A3B-Chat's model.safetensors.index.json, layer and expert numbers folded to N
PUBLISHED_NAMES = {"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"} | {
    f"model.layers.N.{n}.weight" for n in (
        "input_layernorm", "post_attention_layernorm", "mlp.gate", "self_attn.q_proj", "self_attn.k_proj",
        "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm",
        "mlp.experts.N.gate_proj", "mlp.experts.N.up_proj", "mlp.experts.N.down_proj")}
SIZE_KEYS = {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
             "intermediate_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "max_window_layers"}

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return sdar_moe_checkpoints(tmp_path_factory)


# --- the files, as a download brings them ---------------------------------------------------------

def test_files_as_published(checkpoints):
    lm, _ = checkpoints("main")
    path, real = lm.path, published_config()
    config = json.loads((path / "config.json").read_text())
    assert list(config) == list(real)                                    # every key, the published order
    assert {k for k in real if config[k] != real[k]} == SIZE_KEYS
    assert "mask_token_id" not in config and "block_size" not in config
    for name in COPIED:                                                  # byte copies of the published files
        assert (path / name).read_bytes() == (PUBLISHED_DIR / name).read_bytes(), name
    if SHARED.is_dir():                                                  # ... and those are the download's
        for name in (*COPIED, "config.json", "vocab.json", "merges.txt"):
            assert (SHARED / name).read_bytes() == ((PUBLISHED_DIR if name == "config.json" else path) / name).read_bytes()
        published = json.loads((SHARED / "model.safetensors.index.json").read_text())["weight_map"]
        assert {re.sub(r"\.\d+\.", ".N.", k) for k in published} == PUBLISHED_NAMES
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    assert {re.sub(r"\.\d+\.", ".N.", k) for k in index} == PUBLISHED_NAMES and len(set(index.values())) == 3


def test_the_published_shape_has_the_published_size():
    """Built on the meta device from the real config.json: as many parameters as the published shards
    hold (their index's total_size, bf16), 3.3B of them active per token."""
    from fastdllm.checkpoints.info import idle_expert_parameters
    from fastdllm.models.sdar_moe import SDARMoeConfig, SDARMoeForCausalLM

    config = SDARMoeConfig.from_dict(published_config())
    assert config.routing.score == "softmax_renorm" and all(map(config.is_sparse, range(48)))
    with torch.device("meta"):
        model = SDARMoeForCausalLM(config)
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    total = sum(t.numel() for t in model.parameters())
    assert total * 2 == 61064245248                                      # the index's metadata.total_size
    assert len(shapes) == 18867                                          # the index's tensor count
    assert shapes["model.layers.47.mlp.experts.127.down_proj.weight"] == (2048, 768)
    assert round((total - idle_expert_parameters(shapes, config)) / 1e9, 2) == 3.35


def test_loads_as_a_user_download(checkpoints):
    """No mask_token_id, no block_size, no pad id in config.json: mask from the tokenizer, block 4,
    stops from config + generation config + the chat template's end of turn."""
    lm, _ = checkpoints("main")
    assert (lm.family, lm.specials.mask, lm.specials.pad, lm.specials.eot) == ("sdar_moe", MASK_ID, 151643, 151645)
    assert set(lm.specials.stops) == {151643, 151645} and lm.info["attention"] == "block-causal(4)"
    assert lm.tokenizer.decode(lm.encode("hi")) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert lm.tokenizer.decode(lm.encode("hi", thinking=False)).endswith("assistant\n<think>\n\n</think>\n\n")
    moe = lm.model.model.layers[0].mlp
    assert moe.gate.routing == Routing("softmax_renorm", 8, 3, model_dtype_logits=True) and len(moe.experts) == 8
    assert moe.shared_experts is None
    mixed, _ = checkpoints("mixed")
    kinds = [hasattr(block.mlp, "experts") for block in mixed.model.blocks]
    assert kinds == [False, True, False, False] and mixed.model.blocks[1].mlp.gate.routing.score == "softmax"
    assert mixed.model.blocks[0].mlp.down_proj.weight.shape == (64, 96)  # dense: intermediate_size


def test_the_naive_forward_is_transformers_qwen3_moe(checkpoints):
    """The transcription (causal mask) equals transformers' Qwen3-MoE on the same weights (its experts
    stacked into gate_up_proj / down_proj): the naive reference is not wrong in the same way as ours."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    for name in SDAR_MOE:
        _, naive = checkpoints(name)
        c = {k: v for k, v in naive.cfg.items() if k not in ("architectures", "auto_map", "model_type", "torch_dtype")}
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**c, attn_implementation="eager", experts_implementation="eager"))
        state = {}
        for key, value in naive.w.items():
            m = re.match(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(\w+)_proj\.weight", key)
            if m is None:
                state[key] = value
            elif m[3] == "gate":                                           # rows: gate | up
                state.setdefault(m[1] + ".gate_up_proj", {})[int(m[2])] = torch.cat(
                    [value, naive.w[key.replace("gate_proj", "up_proj")]])
            elif m[3] == "down":
                state.setdefault(m[1] + ".down_proj", {})[int(m[2])] = value
        state = {k: torch.stack([v[j] for j in range(len(v))]) if isinstance(v, dict) else v for k, v in state.items()}
        model = model.double().eval()
        assert model.load_state_dict(state, strict=True)
        ids, pos = prompt_of(12, **QWEN_IDS), range(12)
        ours_ = naive.forward(ids, pos, None, torch.tensor(pos)[:, None] >= torch.tensor(pos)[None, :])[0]
        with torch.no_grad():
            theirs = model(torch.tensor([ids])).logits[0]
        # transformers keeps RoPE, RMSNorm and the router softmax in float32: ~1e-5 apart on logits of ~10
        assert (ours_ - theirs).abs().max() < 1e-3


# --- the forward ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SDAR_MOE))
def test_logits_and_router_decisions_equal_the_reference(checkpoints, name):
    lm, naive = checkpoints(name)
    ids = prompt_of(45, seed=3, **QWEN_IDS)                                          # not a whole number of blocks
    logits, routes = our_logits(lm, ids)
    expected = ref.full_logits(naive, ids, 4)
    assert torch.allclose(logits, expected, rtol=0, atol=1e-10)
    assert len(routes) == len(naive.routes) == sum(naive.sparse) > 0
    for (weights, experts), route in zip(routes, naive.routes):
        assert experts.tolist() == route.experts                        # same experts, same order
        assert torch.allclose(weights, torch.tensor(route.weights, dtype=torch.float64), rtol=0, atol=1e-12)
        sums = weights.sum(-1)
        assert torch.allclose(sums, torch.ones_like(sums)) == naive.renorm     # renormalised iff norm_topk_prob
    assert len({tuple(e) for route in naive.routes for e in route.experts}) > 5   # choices vary by token
    changed, _ = our_logits(lm, ids[:-1] + [ids[-1] + 1])
    # block-causal: blocks 0-10 never see position 44 (rounding aside: experts group other rows)
    assert float((changed[:44] - logits[:44]).abs().max()) < 1e-9 < float((changed[44] - logits[44]).abs().max())


def test_the_router_rounds_its_logits_to_the_model_dtype():
    """Qwen3-MoE's gate is a Linear in the model dtype (bf16 logits), then a float32 softmax."""
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(64, 32, generator=g).bfloat16(), torch.randn(8, 32, generator=g).bfloat16()
    router = Router(32, Routing("softmax_renorm", 8, 3, model_dtype_logits=True))
    router.weight.data = weight
    weights, experts = router(x)
    probs = torch.nn.functional.linear(x, weight).float().softmax(-1)
    top = probs.topk(3, dim=-1)
    assert weights.dtype == torch.float32 and torch.equal(experts, top.indices)
    assert torch.equal(weights, top.values / top.values.sum(-1, keepdim=True))
    exact = torch.nn.functional.linear(x.float(), weight.float()).softmax(-1).topk(3, dim=-1).values
    assert not torch.equal(top.values, exact)                           # the rounding is visible


# --- decoding (the rules against the authors' decoder: tests/references/test_exactness.py) --------------

@pytest.mark.parametrize("cache", ["prefix", "none"])
def test_a_batch_decodes_each_row_as_alone(checkpoints, cache):
    """Rows of different lengths share every expert matmul: each still routes and decodes as alone."""
    lm, _ = checkpoints("main")
    cfg = DecodeConfig(gen_len=16, block_len=4, rule="dynamic", threshold=0.7, cache=cache, early_stop=False)
    prompts = [prompt_of(n, seed=i, **QWEN_IDS) for i, n in enumerate([3, 11, 6])]
    batch = block_steps(lm, prompts, cfg)[2]
    for row, prompt in enumerate(prompts):
        alone = block_steps(lm, [prompt], cfg)[2]
        assert batch.ids[row] == alone.ids[0]
        assert batch.canvas[row, :alone.canvas.shape[1]].tolist() == alone.canvas[0].tolist()


# --- the CLI, info, quantization, errors ------------------------------------------------------------

def test_generate_and_info_through_the_cli(checkpoints):
    lm, naive = checkpoints("main")
    record = json.loads(invoke("generate", "-m", lm.path, "--json", "-n", "16", "--raw", "def f(x):").stdout)
    assert record["profile"] == "sdar" and record["model"]["attention"] == "block-causal(4)"
    assert (record["config"]["block_len"], record["config"]["rule"], record["config"]["threshold"],
            record["config"]["cache"]) == (4, "dynamic", 0.95, "prefix")
    assert record["nfe"] >= 1 and len(record["ids"]) <= 16 + 4
    info = json.loads(invoke("info", lm.path, "--json").stdout)
    assert (info["family"], info["architectures"], info["mask_id"], info["end_of_turn_id"]) == (
        "sdar_moe", ["SDARMoeForCausalLM"], MASK_ID, 151645)
    experts = sum(t.numel() for n, t in naive.w.items() if ".mlp.experts." in n)
    assert experts == 2 * 8 * 3 * 64 * 32
    assert info["parameters"] == sum(t.numel() for t in naive.w.values())
    assert info["active_parameters"] == info["parameters"] - experts * (8 - 3) // 8   # k of E experts per token
    assert info["block_matrix_parameters"] < info["parameters"] - 2 * 151936 * 64     # routers, norms, embedding, head
    assert "active per token" in invoke("info", lm.path).stdout


@pytest.mark.parametrize("quantize", ["8bit", "4bit"])
def test_quantized_on_cpu(checkpoints, quantize):
    path = checkpoints("main")[0].path
    lm = loading.load(path, dtype="bf16", quantize=quantize)
    moe = lm.model.model.layers[1].mlp
    assert type(moe.experts[0].gate_proj).__module__.startswith("bitsandbytes")   # experts quantized
    assert type(lm.model.model.layers[1].self_attn.q_proj).__module__.startswith("bitsandbytes")
    assert moe.gate.weight.dtype == torch.bfloat16                                 # the router not
    result = run(lm.decoder, [prompt_of(5, **QWEN_IDS)], DecodeConfig(gen_len=16, block_len=4, early_stop=False))
    assert result.nfe >= 4 and MASK_ID not in result.canvas[0].tolist()


def _variant(checkpoints, tmp_path, **changes):
    path = shutil.copytree(checkpoints("main")[0].path, tmp_path / f"v{len(list(tmp_path.iterdir()))}")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **changes}))
    return path


def test_malformed_or_unsupported_configs_fail_in_one_line(checkpoints, tmp_path):
    cases = [
        ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 is not in 1..num_experts (8)"),
        ({"decoder_sparse_step": 0}, "decoder_sparse_step must be a positive integer, not 0"),
        ({"mlp_only_layers": "0"}, "mlp_only_layers must list layer numbers"),
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide num_attention_heads 4"),
        ({"attention_bias": True}, "config.json sets attention_bias=True"),
        ({"use_sliding_window": True}, "config.json sets use_sliding_window=True (sliding-window attention); fastdllm's sdar_moe does not implement it yet"),
        ({"architectures": ["Qwen3MoeForCausalLM"]}, "unsupported architecture"),
    ]
    for changes, message in cases:
        with pytest.raises(UserError, match=re.escape(message)) as err:
            loading.load(_variant(checkpoints, tmp_path, **changes))
        assert "\n" not in str(err.value)
    r = invoke("generate", "-m", _variant(checkpoints, tmp_path, decoder_sparse_step=0), "hi")
    assert r.exit_code == 1 and "decoder_sparse_step" in r.stderr and len(r.stderr.strip().splitlines()) == 1
