"""The tiny MoE checkpoints (fastdllm/testing/tiny_moe.py) and the naive references (tests/references/reference_moe.py)
themselves: files, config keys and tensor names as docs/specs/llada2-moe.md and docs/specs/llada-moe.md state,
tokenizer ids and chat templates, the MoE blocks against transformers' DeepSeek-V3 / OLMoE blocks (the
same router math), attention patterns, partial RoPE, and the decoders' own invariants."""

from __future__ import annotations

import json

import pytest
import reference_moe as ref
import torch

from fastdllm.testing.tiny_moe import (
    BOS_ID,
    EOS_ID,
    MASK_ID,
    PUBLISHED,
    PUBLISHED_DIRS,
    ROLE_END_ID,
    TOKENIZER_LEN,
    VOCAB_SIZE,
    write_llada2_moe,
    write_llada_moe,
)

PROMPT = torch.randint(6, 4000, (40,), generator=torch.Generator().manual_seed(7)).tolist()
SHARDS = {f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)}
OTHER_FILES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json"}
ALT_LLADA2 = dict(use_bias=True, use_qkv_bias=True, num_shared_experts=None, first_k_dense_replace=0, sharded=False)
ALT_LLADA_MOE = dict(num_key_value_heads=2, shared_expert_intermediate_size=48, moe_layer_freq=[0, 1],
                     moe_router_enable_expert_bias=True)


pytestmark = pytest.mark.sweep   # each test's first case in the fast lane, the rest in the full suite (tests/conftest.py)


@pytest.fixture(scope="module", autouse=True)
def reference_bans_nothing(one_thread):
    ref.BANNED[:] = []


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {"llada2": write_llada2_moe(root / "llada2"), "llada2_alt": write_llada2_moe(root / "llada2-alt", **ALT_LLADA2),
            "llada_moe": write_llada_moe(root / "llada-moe"),
            "llada_moe_alt": write_llada_moe(root / "llada-moe-alt", **ALT_LLADA_MOE)}


@pytest.fixture(scope="module")
def llada2(dirs):
    return ref.NaiveLLaDA2(dirs["llada2"])


@pytest.fixture(scope="module")
def llada_moe(dirs):
    return ref.NaiveLLaDAMoE(dirs["llada_moe"])


def published(family):
    return json.loads((PUBLISHED / PUBLISHED_DIRS[family] / "config.json").read_text())


# ---------------------------------------------------------------- checkpoint files

def test_llada2_files(dirs, llada2):
    d = dirs["llada2"]
    assert {p.name for p in d.iterdir()} == OTHER_FILES | SHARDS | {"model.safetensors.index.json"}
    c = json.loads((d / "config.json").read_text())
    assert list(c) == list(published("llada2_moe")) == sorted(c)          # every published key, published order
    assert (c["model_type"], c["architectures"], c["dtype"], c["vocab_size"], c["pad_token_id"]) == (
        "llada2_moe", ["LLaDA2MoeModelLM"], "bfloat16", VOCAB_SIZE, EOS_ID)
    assert (c["head_dim"], c["rotary_dim"], c["num_experts"], c["n_group"], c["topk_group"], c["num_experts_per_tok"]) == (
        24, 12, 8, 4, 2, 3)
    assert not any(k in c for k in ("use_qk_norm", "mask_token_id", "eos_token_id", "block_size"))
    # names checked by the reference's loader; dtypes and shapes here
    assert all(t == torch.bfloat16 for k, t in llada2.dtypes.items() if not k.endswith("expert_bias"))
    assert llada2.dtypes["model.layers.1.mlp.gate.expert_bias"] == torch.float32
    w = llada2.w
    assert w["model.layers.0.attention.query_key_value.weight"].shape == ((4 + 2 * 2) * 24, 64)
    assert w["model.layers.0.attention.dense.weight"].shape == (64, 96)
    assert w["model.layers.0.mlp.gate_proj.weight"].shape == (96, 64)                # dense layer 0
    assert w["model.layers.2.mlp.experts.7.down_proj.weight"].shape == (64, 32)
    assert w["model.layers.1.mlp.shared_experts.up_proj.weight"].shape == (32, 64)
    assert "model.layers.0.mlp.gate.weight" not in w and "model.layers.1.mlp.gate_proj.weight" not in w
    assert len(w) == 3 + 3 * 6 + 3 + 2 * (2 + 8 * 3 + 3)
    bias = w["model.layers.1.mlp.gate.expert_bias"]
    assert bias.abs().max() < 0.3 and bias.std() > 0.1
    assert not torch.all(w["model.layers.1.attention.query_layernorm.weight"] == 1)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == SHARDS and index["weight_map"]["lm_head.weight"].startswith("model-00003")
    sizes = {torch.float32: 4, torch.bfloat16: 2}
    assert index["metadata"]["total_size"] == sum(w[k].numel() * sizes[t] for k, t in llada2.dtypes.items())


def test_llada2_variants(dirs, tmp_path):
    alt = ref.NaiveLLaDA2(dirs["llada2_alt"])        # the loader asserts the exact name set
    assert "model.safetensors" in {p.name for p in dirs["llada2_alt"].iterdir()}
    assert "model.layers.0.attention.query_key_value.bias" in alt.w and "model.layers.2.attention.dense.bias" in alt.w
    assert "model.layers.0.mlp.gate.expert_bias" in alt.w and not any("shared" in k for k in alt.w)
    c = json.loads((dirs["llada2_alt"] / "config.json").read_text())
    assert c["num_shared_experts"] is None and c["first_k_dense_replace"] == 0
    no_norm = ref.NaiveLLaDA2(write_llada2_moe(tmp_path / "no-qk-norm", use_qk_norm=False, drop_keys=("dtype",),
                                               torch_dtype="bfloat16"))
    assert not any("query_layernorm" in k or "key_layernorm" in k for k in no_norm.w)
    c = no_norm.cfg
    assert c["use_qk_norm"] is False and "dtype" not in c and c["torch_dtype"] == "bfloat16" and list(c) == sorted(c)
    with pytest.raises(ValueError, match="not a llada2_moe config key"):
        write_llada2_moe(tmp_path / "typo", num_expert=4)


def test_llada_moe_files(dirs, llada_moe):
    d = dirs["llada_moe"]
    assert {p.name for p in d.iterdir()} == OTHER_FILES | SHARDS | {"model.safetensors.index.json"}
    c = json.loads((d / "config.json").read_text())
    assert list(c) == sorted(set(published("llada_moe")) | {"dense_intermediate_size"})
    assert (c["model_type"], c["architectures"], c["moe_layer_freq"], c["eos_token_id"], c["pad_token_id"]) == (
        "llada", ["LLaDAMoEModelLM"], [1, 1], EOS_ID, EOS_ID)
    assert "rms_norm_eps" not in c and "head_dim" not in c and c["shared_expert_intermediate_size"] is None
    assert all(t == torch.bfloat16 for t in llada_moe.dtypes.values())
    w = llada_moe.w
    assert w["model.layers.0.self_attn.q_norm.weight"].shape == (16,)                 # head_dim = 64 / 4
    assert w["model.layers.1.self_attn.k_proj.weight"].shape == (64, 64)
    assert w["model.layers.1.mlp.experts.7.gate_proj.weight"].shape == (32, 64)
    assert w["model.layers.0.mlp.gate.weight"].shape == (8, 64)
    assert len(w) == 3 + 2 * (8 + 1 + 8 * 3) and not any("bias" in k for k in w)


def test_llada_moe_variant(dirs):
    alt = ref.NaiveLLaDAMoE(dirs["llada_moe_alt"])
    w = alt.w
    assert w["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)              # GQA: 2 KV heads x 16
    assert "model.layers.0.mlp.gate_proj.weight" in w and "model.layers.0.mlp.gate.weight" not in w
    assert w["model.layers.1.mlp.expert_bias"].shape == (8,) and "model.layers.0.mlp.expert_bias" not in w
    assert w["model.layers.0.shared_expert.down_proj.weight"].shape == (64, 48)
    assert alt.dtypes["model.layers.1.mlp.expert_bias"] == torch.float32


def test_tokenizers(dirs):
    from transformers import PreTrainedTokenizerFast
    for family in ("llada2", "llada_moe"):
        tok = PreTrainedTokenizerFast.from_pretrained(dirs[family])
        assert len(tok) == TOKENIZER_LEN < VOCAB_SIZE and VOCAB_SIZE % 128 == 0
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.mask_token_id) == (BOS_ID, EOS_ID, EOS_ID, MASK_ID)
        assert MASK_ID - EOS_ID == 156895 - 156892
        assert tok.convert_tokens_to_ids(["<role>", "</role>", "<|role_end|>"]) == [4098, 4099, ROLE_END_ID]
        assert tok.encode("x = 1<|mask|><|role_end|>")[-2:] == [MASK_ID, ROLE_END_ID]
        assert tok.decode(tok.encode("def f(x):\n    return x")) == "def f(x):\n    return x"
    gen = json.loads((dirs["llada2"] / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"]) == (EOS_ID, EOS_ID)
    msgs = [{"role": "user", "content": "Hi"}]
    tok = PreTrainedTokenizerFast.from_pretrained(dirs["llada2"])
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (   # D1's hand-built prompt
        "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>")
    chat = [{"role": "system", "content": "S"}] + msgs + [{"role": "assistant", "content": "<think>t</think>\nA"}]
    assert tok.apply_chat_template(chat, tokenize=False) == (
        "<role>SYSTEM</role>S\ndetailed thinking off<|role_end|><role>HUMAN</role>Hi<|role_end|>"
        "<role>ASSISTANT</role>A<|role_end|>")
    tok = PreTrainedTokenizerFast.from_pretrained(dirs["llada_moe"])
    assert tok.apply_chat_template([{"role": "system", "content": "You are a helpful AI assistant."}] + msgs, tokenize=False,
                                   add_generation_prompt=True) == (
        "<role>SYSTEM</role>You are a helpful AI assistant.<|role_end|><role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>")


# ---------------------------------------------------------------- the naive forward

def test_forward_and_routes(llada2, llada_moe):
    ids = PROMPT[:20] + [MASK_ID] * 12
    logits = llada2.forward(ids, block_length=8)
    assert logits.shape == (32, VOCAB_SIZE) and logits.dtype == torch.float64
    assert [r.layer for r in llada2.routes] == [1, 2]                 # layer 0 is dense
    for r in llada2.routes:
        for experts, weights in zip(r.experts, r.weights):
            assert len(set(experts)) == 3 and abs(sum(weights) - 2.5) < 1e-12      # normalised, times 2.5
            assert len({j // 2 for j in experts}) <= 2                             # within topk_group groups
    logits = llada_moe.forward(ids, rows=[0, 31])
    assert logits.shape == (2, VOCAB_SIZE) and [r.layer for r in llada_moe.routes] == [0, 1]
    for r in llada_moe.routes:
        assert all(len(set(e)) == 3 and 0 < sum(w) < 1 and w == sorted(w, reverse=True) for e, w in zip(r.experts, r.weights))


def test_group_limit_and_bias_change_routing(dirs, llada2):
    plain = ref.NaiveLLaDA2(dirs["llada2"], group_limit=False)
    llada2.forward(PROMPT, block_length=8)
    plain.forward(PROMPT, block_length=8)
    changed = sum(sorted(a) != sorted(b) for r, q in zip(llada2.routes, plain.routes) for a, b in zip(r.experts, q.experts))
    assert changed >= 1
    c, bias = llada2.cfg, llada2.w["model.layers.1.mlp.gate.expert_bias"]
    kw = dict(n_group=4, topk_group=2, k=3, scale=2.5)
    rows = torch.randn(200, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert any(sorted(ref.llada2_route(x, bias, **kw)[0]) != sorted(ref.llada2_route(x, 0 * bias, **kw)[0]) for x in rows)
    idx, w = ref.llada2_route(rows[0], bias, n_group=4, topk_group=2, k=1, scale=2.5)
    assert len(idx) == 1 and w == [2.5 * float(torch.sigmoid(rows[0][idx[0]]))]        # k = 1: no normalisation
    assert c["routed_scaling_factor"] == 2.5


def test_llada2_moe_block_matches_deepseek_v3(llada2):
    """The LLaDA2 MoE block (sigmoid scores, top-2-sum groups, biased choice, unbiased normalised weights,
    times 2.5, plus the shared expert) is DeepSeek-V3's; transformers' block on the same weights agrees."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    cfg = DeepseekV3Config(hidden_size=64, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                           topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True)
    block, p, w = DeepseekV3MoE(cfg).double(), "model.layers.2.mlp.", llada2.w
    with torch.no_grad():
        block.gate.weight.copy_(w[p + "gate.weight"])
        block.gate.e_score_correction_bias.copy_(w[p + "gate.expert_bias"])
        for j in range(8):
            e = p + f"experts.{j}."
            block.experts.gate_up_proj[j] = torch.cat([w[e + "gate_proj.weight"], w[e + "up_proj.weight"]])
            block.experts.down_proj[j] = w[e + "down_proj.weight"]
        for m in ("gate", "up", "down"):
            getattr(block.shared_experts, f"{m}_proj").weight.copy_(w[p + f"shared_experts.{m}_proj.weight"])
        h = torch.randn(64, 64, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        theirs = block(h[None])[0]
    ours = llada2.mlp_block(h, 2)
    assert (ours - theirs).abs().max() < 1e-5 * theirs.abs().max()        # their router runs in float32


def test_llada_moe_block_matches_olmoe(llada_moe):
    from transformers import OlmoeConfig
    from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock
    cfg = OlmoeConfig(hidden_size=64, intermediate_size=32, num_experts=8, num_experts_per_tok=3, norm_topk_prob=False)
    block, p, w = OlmoeSparseMoeBlock(cfg).double(), "model.layers.1.mlp.", llada_moe.w
    with torch.no_grad():
        block.gate.weight.copy_(w[p + "gate.weight"])
        for j in range(8):
            e = p + f"experts.{j}."
            block.experts.gate_up_proj[j] = torch.cat([w[e + "gate_proj.weight"], w[e + "up_proj.weight"]])
            block.experts.down_proj[j] = w[e + "down_proj.weight"]
        h = torch.randn(64, 64, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        theirs = block(h[None])[0]
    ours = llada_moe.mlp_block(h, 1)
    assert (ours - theirs).abs().max() < 1e-5 * theirs.abs().max()


def test_attention_patterns(llada2, llada_moe):
    ids = PROMPT[:24]
    changed = ids[:20] + [MASK_ID] + ids[21:]                         # a change in block 2 (B = 8)
    a, b = llada2.forward(ids, block_length=8), llada2.forward(changed, block_length=8)
    assert torch.equal(a[:16], b[:16]) and (a[16:] - b[16:]).abs().max() > 1e-3
    a, b = llada_moe.forward(ids), llada_moe.forward(ids[:-1] + [MASK_ID])
    assert (a[0] - b[0]).abs().max() > 1e-6                           # bidirectional: the last token reaches the first


def test_partial_rope(llada2, llada_moe):
    x = torch.randn(4, 5, 24, dtype=torch.float64)
    y = llada2.rope(x, range(3, 8))
    assert llada2.rotary_dim == 12 and torch.equal(y[..., 12:], x[..., 12:])
    pair = lambda t: t[..., :6].pow(2) + t[..., 6:12].pow(2)         # rotate-half pairs (i, i + 6) keep their norm
    assert torch.allclose(pair(y), pair(x)) and not torch.allclose(y[..., :12], x[..., :12])
    assert torch.equal(llada2.rope(x, [0] * 5), x) and llada_moe.rotary_dim == 16


def test_confidences_vary(llada2, llada_moe):
    for naive in (llada2, llada_moe):
        x, p = ref.greedy(naive.forward(PROMPT + [MASK_ID] * 24, block_length=32))
        assert any(c > 0.9 for c in p) and any(c < 0.5 for c in p)
        assert MASK_ID not in x and max(x) < TOKENIZER_LEN               # scaled-down rows never win


# ---------------------------------------------------------------- LLaDA2 decoder (H1 / D1 rule)

@pytest.mark.parametrize("L", [16, 17, 23, 5])                          # L % B in {0, 1, B-1}, L < B
@pytest.mark.parametrize("steps", [8, 4])
def test_llada2_generate_commits_every_position(llada2, L, steps):
    tr = ref.llada2_generate(llada2, PROMPT[:L], mask_id=MASK_ID, eos_id=-1, gen_length=16, block_length=8,
                             steps=steps, threshold=0.9)
    nb = -(-(L + 16) // 8)
    assert tr.canvas[:L] == PROMPT[:L] and MASK_ID not in tr.canvas and not tr.stopped
    assert sorted(p for _, c in tr.steps for p, _ in c) == list(range(L, nb * 8))   # each position once
    assert tr.tokens == tr.canvas[L:L + 16] and tr.blocks == list(range(L // 8, nb))
    assert tr.nfe == len(tr.steps) and all(n <= steps for n in tr.steps_per_block().values())
    assert tr.nfe_with_store == tr.nfe + len(tr.blocks) - 1
    quota = [8 // steps] * steps
    per_block = {}
    for (b, commit), conf in zip(tr.steps, tr.confidences):
        got, i = {p for p, _ in commit}, per_block.setdefault(b, 0)
        per_block[b] += 1
        hi = {p for p, c in conf.items() if c > 0.9}
        assert got == hi if len(hi) >= quota[i] else len(got) == min(quota[i], len(conf))
        assert all(conf[p] >= conf[q] for p in got for q in set(conf) - got)


def test_llada2_dinfer_rule(llada2):
    tr = ref.llada2_generate(llada2, PROMPT[:11], mask_id=MASK_ID, eos_id=-1, gen_length=16, block_length=8,
                             threshold=0.8, rule="dinfer")
    assert sorted(p for _, c in tr.steps for p, _ in c) == list(range(11, 32))
    for (_, commit), conf in zip(tr.steps, tr.confidences):
        best = max(conf.values())
        assert {p for p, _ in commit} == {p for p, c in conf.items() if c >= min(0.8, best - 1e-5)}


def test_llada2_eos_stop(llada2):
    full = ref.llada2_generate(llada2, PROMPT[:11], mask_id=MASK_ID, eos_id=-1, gen_length=24, block_length=8, steps=8)
    eos = full.tokens[8]                                               # a token the model does produce (block 2)
    first = full.tokens.index(eos)
    tr = ref.llada2_generate(llada2, PROMPT[:11], mask_id=MASK_ID, eos_id=eos, gen_length=24, block_length=8, steps=8)
    assert tr.stopped and tr.tokens == full.tokens[:first + 1]
    b = (11 + first) // 8                                              # that block is finished, later ones untouched
    assert tr.blocks[-1] == b and MASK_ID not in tr.canvas[:(b + 1) * 8] and set(tr.canvas[(b + 1) * 8:]) == {MASK_ID}
    early = ref.llada2_generate(llada2, PROMPT[:11], mask_id=MASK_ID, eos_id=eos, gen_length=24, block_length=8, steps=8,
                                eos_early_stop=True)
    assert early.tokens == tr.tokens and early.nfe <= tr.nfe


def test_banned_mask_id(llada2):
    ref.BANNED[:] = [MASK_ID]
    try:
        logits = torch.zeros(2, VOCAB_SIZE, dtype=torch.float64)
        logits[:, MASK_ID] = 5.0
        x, p = ref.greedy(logits)
        assert x == [0, 0] and p[0] == pytest.approx(1 / (VOCAB_SIZE - 1 + torch.e ** 5))   # full-softmax probability
    finally:
        ref.BANNED[:] = []


# ---------------------------------------------------------------- LLaDA-MoE decoder (the model card's)

@pytest.mark.parametrize("steps, per_step", [(16, 1), (8, 2)])
def test_llada_moe_generate(llada_moe, steps, per_step):
    L = 13
    tr = ref.llada_moe_generate(llada_moe, PROMPT[:L], mask_id=MASK_ID, gen_length=16, block_length=8, steps=steps)
    assert tr.nfe == steps and tr.steps_per_block() == {0: steps // 2, 1: steps // 2}
    assert all(len(c) == per_step for _, c in tr.steps) and MASK_ID not in tr.canvas
    assert sorted(p for _, c in tr.steps for p, _ in c) == list(range(L, L + 16)) and len(tr.tokens) == 16
    for b, commit in tr.steps:                                         # always inside the current block
        assert all(L + 8 * b <= p < L + 8 * (b + 1) for p, _ in commit)
    first = llada_moe.forward(PROMPT[:L] + [MASK_ID] * 16)               # the first step from a direct forward
    x, p = ref.greedy(first)
    best = max(range(L, L + 8), key=lambda j: (p[j], -j))
    assert (best, x[best]) in tr.steps[0][1]
    stop = tr.tokens[3]
    cut = ref.llada_moe_generate(llada_moe, PROMPT[:L], mask_id=MASK_ID, gen_length=16, block_length=8, steps=steps,
                                 stop_ids=(stop,))
    assert cut.stopped and cut.tokens == tr.tokens[:tr.tokens.index(stop) + 1] and cut.canvas == tr.canvas
