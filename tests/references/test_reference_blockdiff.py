"""The tiny block-diffusion checkpoints (fastdllm/testing/tiny_blockdiff.py) and the naive reference decoders
(tests/references/reference_blockdiff.py) themselves: files and names as docs/specs/fast-dllm-v2.md and docs/specs/sdar.md
state, tokenizer ids, the naive forward against transformers' Qwen2/Qwen3, and the decoders' own
invariants (quotas, one token per step, AR tokens, NFE formulas, exact prefix cache, prompt lengths)."""

from __future__ import annotations

import json

import pytest
import torch
from reference_blockdiff import (
    NaiveQwen,
    full_logits,
    greedy,
    sdar_generate,
    v2_generate,
)
from safetensors.torch import load_file

from fastdllm.testing.tiny_blockdiff import (
    SDAR_MASK_ID,
    V2_MASK_ID,
    V2_STOP_ID,
    write_fast_dllm_v2,
    write_sdar,
)

SDAR_STOPS = (151645, 151643)          # generation_config eos ids
G_SDAR, G_V2 = 16, 64
THR = 0.7                              # v2 rule threshold in most runs: several commits per step, fewer forwards
PROMPT = torch.randint(0, 150000, (70,), generator=torch.Generator().manual_seed(7)).tolist()
QKV = ("q_proj", "k_proj", "v_proj")


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]   # tests/conftest.py


@pytest.fixture(scope="session")
def v2_dir(tiny):
    return tiny("fast_dllm_v2")


@pytest.fixture(scope="session")
def sdar_dir(tiny):
    return tiny("sdar")


@pytest.fixture(scope="session")
def v2(v2_dir):
    return NaiveQwen(v2_dir)


@pytest.fixture(scope="session")
def sdar(sdar_dir):
    return NaiveQwen(sdar_dir)


_RUNS = {}


def run_sdar(naive, L, **kw):
    key = ("sdar", L, tuple(sorted(kw.items())))
    if key not in _RUNS:
        args = dict(mask_id=SDAR_MASK_ID, stop_ids=SDAR_STOPS, gen_length=G_SDAR, block_length=4, denoising_steps=4)
        _RUNS[key] = sdar_generate(naive, PROMPT[:L], **{**args, **kw})
    return _RUNS[key]


def run_v2(naive, L, **kw):
    key = ("v2", L, tuple(sorted(kw.items())))
    if key not in _RUNS:
        args = dict(mask_id=V2_MASK_ID, stop_id=V2_STOP_ID, max_new_tokens=G_V2, block_size=32, small_block_size=8)
        _RUNS[key] = v2_generate(naive, PROMPT[:L], **{**args, **kw})
    return _RUNS[key]


def expected_names(n_layers, *, bias, qk_norm, head):
    names = {"model.embed_tokens.weight", "model.norm.weight"} | ({"lm_head.weight"} if head else set())
    for i in range(n_layers):
        p = f"model.layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight", p + "self_attn.o_proj.weight"}
        names |= {p + f"mlp.{m}_proj.weight" for m in ("gate", "up", "down")}
        names |= {p + f"self_attn.{m}.weight" for m in QKV} | ({p + f"self_attn.{m}.bias" for m in QKV} if bias else set())
        names |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"} if qk_norm else set()
    return names


def tensors(d):
    """All tensors by name; with an index, each shard must hold exactly what the index maps to it."""
    out, index = {}, d / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"] if index.exists() else None
    for f in sorted(d.glob("*.safetensors")):
        part = load_file(str(f))
        assert weight_map is None or set(part) == {k for k, v in weight_map.items() if v == f.name}
        out.update(part)
    return out


TOKENIZER_FILES = {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "config.json", "generation_config.json"}


# ---------------------------------------------------------------- checkpoint files

def test_v2_files(v2_dir, tmp_path):
    shards = {f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)}
    assert {p.name for p in v2_dir.iterdir()} == TOKENIZER_FILES | shards | {"model.safetensors.index.json"}
    c = json.loads((v2_dir / "config.json").read_text())
    assert (c["model_type"], c["architectures"], c["bd_size"], c["conplemenrary_mask"]) == (
        "Fast_dLLM_Qwen", ["Fast_dLLM_QwenForCausalLM"], 32, True)
    assert (c["bos_token_id"], c["eos_token_id"], c["pad_token_id"], c["vocab_size"]) == (151643, 151645, 151645, 152064)
    assert c["layer_types"] == ["full_attention"] * 2 and c["max_position_embeddings"] == 32768
    assert c["auto_map"]["AutoModelForCausalLM"] == "modeling.Fast_dLLM_QwenForCausalLM"
    assert "head_dim" not in c and not any("mask" in k for k in c if k != "conplemenrary_mask")
    gen = json.loads((v2_dir / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"], gen["top_k"]) == ([151645, 151643], 151643, 20)
    index = json.loads((v2_dir / "model.safetensors.index.json").read_text())
    names = expected_names(2, bias=True, qk_norm=False, head=True)
    assert set(index["weight_map"]) == names and set(index["weight_map"].values()) == shards
    assert index["weight_map"]["lm_head.weight"] == "model-00004-of-00004.safetensors"
    w = tensors(v2_dir)
    assert set(w) == names and all(t.dtype == torch.bfloat16 for t in w.values())
    assert w["model.embed_tokens.weight"].shape == w["lm_head.weight"].shape == (152064, 64)
    assert w["model.layers.0.self_attn.q_proj.weight"].shape == (64, 64)      # head_dim 16 = 64 / 4
    assert w["model.layers.0.self_attn.k_proj.bias"].shape == (32,)          # 2 KV heads x 16
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in w.values())
    tied = write_fast_dllm_v2(tmp_path / "tied", tie_word_embeddings=True, sharded=False)
    assert {p.name for p in tied.iterdir()} == TOKENIZER_FILES | {"model.safetensors"}
    assert json.loads((tied / "config.json").read_text())["vocab_size"] == 151936
    assert set(tensors(tied)) == expected_names(2, bias=True, qk_norm=False, head=False)
    naive = NaiveQwen(tied)
    assert naive.head is naive.w["model.embed_tokens.weight"] and naive.hd == 16


def test_sdar_files(sdar_dir, tmp_path):
    shards = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    assert {p.name for p in sdar_dir.iterdir()} == TOKENIZER_FILES | shards | {"model.safetensors.index.json"}
    c = json.loads((sdar_dir / "config.json").read_text())
    assert (c["model_type"], c["architectures"], c["head_dim"], c["attention_bias"], c["tie_word_embeddings"]) == (
        "sdar", ["SDARForCausalLM"], 32, False, False)
    assert (c["block_size"], c["mask_token_id"], c["eos_token_id"], c["vocab_size"]) == (4, 151669, 151643, 151936)
    assert "pad_token_id" not in c
    gen = json.loads((sdar_dir / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"], gen["top_p"]) == ([151645, 151643], 151643, 0.95)
    index = json.loads((sdar_dir / "model.safetensors.index.json").read_text())
    names = expected_names(2, bias=False, qk_norm=True, head=True)
    assert set(index["weight_map"]) == names and set(index["weight_map"].values()) == shards
    w = tensors(sdar_dir)
    assert set(w) == names and all(t.dtype == torch.bfloat16 for t in w.values())
    assert w["model.layers.0.self_attn.q_proj.weight"].shape == (128, 64)    # 4 heads x head_dim 32 != 64 / 4
    assert w["model.layers.0.self_attn.k_proj.weight"].shape == (64, 64)
    qn = w["model.layers.1.self_attn.q_norm.weight"].float()
    assert qn.shape == (32,) and not torch.all(qn == 1) and (qn - 1).abs().max() < 0.6
    assert w["lm_head.weight"].shape == (151936, 64) and not torch.equal(w["lm_head.weight"], w["model.embed_tokens.weight"])
    bare = write_sdar(tmp_path / "bare", block_size=None, mask_in_config=False, sharded=False)
    cb = json.loads((bare / "config.json").read_text())
    assert "block_size" not in cb and "mask_token_id" not in cb
    assert {p.name for p in bare.iterdir()} == TOKENIZER_FILES | {"model.safetensors"}
    assert set(tensors(bare)) == names


def test_tokenizers(v2_dir, sdar_dir):
    from transformers import Qwen2Tokenizer
    tok = Qwen2Tokenizer.from_pretrained(v2_dir)
    assert tok.convert_tokens_to_ids(["|<MASK>|", "<|im_end|>", "<|endoftext|>", "<|im_start|>"]) == [151665, 151645, 151643, 151644]
    assert (tok.eos_token, tok.pad_token, len(tok)) == ("<|im_end|>", "<|endoftext|>", 151666)
    assert tok.encode("Hi|<MASK>|<|im_end|>")[-2:] == [151665, 151645]
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert "chat_template" not in json.loads((v2_dir / "tokenizer_config.json").read_text())

    tok = Qwen2Tokenizer.from_pretrained(sdar_dir)
    assert tok.convert_tokens_to_ids(["<|MASK|>", "<|im_end|>", "<|endoftext|>", "<think>"]) == [151669, 151645, 151643, 151667]
    assert (tok.mask_token, tok.eos_token, tok.pad_token, len(tok)) == ("<|MASK|>", "<|endoftext|>", "<|endoftext|>", 151670)
    assert tok.encode("Hi<|MASK|>")[-1] == 151669
    msgs = [{"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tc = json.loads((sdar_dir / "tokenizer_config.json").read_text())
    assert tc["added_tokens_decoder"]["151669"]["special"] is False and tc["chat_template"] == (sdar_dir / "chat_template.jinja").read_text()
    assert json.loads((sdar_dir / "added_tokens.json").read_text())["<MASK>"] == 151669
    assert "<MASK>" in json.loads((sdar_dir / "special_tokens_map.json").read_text())["additional_special_tokens"]


# ---------------------------------------------------------------- the naive forward

@pytest.mark.parametrize("family", ["v2", "sdar"])
def test_confidences_vary(family, v2, sdar):
    """Random weights peaked enough for the rules to matter: some greedy confidences above 0.9, some below 0.5."""
    naive = v2 if family == "v2" else sdar
    _, p = greedy(full_logits(naive, PROMPT[:40], 4))
    assert any(c > 0.9 for c in p) and any(c < 0.5 for c in p)


@pytest.mark.parametrize("family", ["v2", "sdar"])
def test_naive_forward_matches_transformers(family, v2, sdar):
    """The naive float64 forward (causal mask) equals transformers' own Qwen2 / Qwen3 on the same weights."""
    from transformers import (
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )
    naive = v2 if family == "v2" else sdar
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "rms_norm_eps", "rope_theta", "tie_word_embeddings", "head_dim")
    kw = {k: naive.cfg[k] for k in keys if k in naive.cfg}
    cfg, cls = (Qwen2Config, Qwen2ForCausalLM) if family == "v2" else (Qwen3Config, Qwen3ForCausalLM)
    model = cls(cfg(**kw, attn_implementation="eager")).double().eval()
    missing = model.load_state_dict(naive.w, strict=False)
    assert not missing.unexpected_keys and set(missing.missing_keys) <= {"lm_head.weight"}
    ids, pos = PROMPT[:12], range(12)
    ours = naive.forward(ids, pos, None, torch.tensor(pos)[:, None] >= torch.tensor(pos)[None, :])[0]
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0]
    # transformers keeps RoPE angles, RMSNorm and softmax in float32 even in a float64 model: ~1e-5
    # apart on logits of size ~10; a wrong layout (RoPE halves, GQA grouping, q/k norm, bias) is O(1)
    assert (ours - theirs).abs().max() < 1e-3


# ---------------------------------------------------------------- SDAR reference

def test_sdar_static_one_per_step_and_nfe(sdar):
    L = 9
    tr = run_sdar(sdar, L, strategy="low_confidence_static", check_cache=True)
    assert all(len(c) == 1 for _, c in tr.steps)
    nb = -(-(L + G_SDAR) // 4)
    assert len(tr.tokens) == nb * 4 - L and not tr.stopped and tr.canvas[:L] == PROMPT[:L]
    assert len(tr.steps) == nb * 4 - L                        # one step per mask: B = T, quota 1
    blocks = tr.steps_per_block()
    assert sorted(blocks) == list(range(L // 4, nb))
    assert tr.nfe == 1 + len(tr.steps) + len(blocks) - 1      # prefill + steps + stores (none after the last)
    assert tr.nfe_published == tr.nfe + 1
    assert tr.cache_err < 1e-10                               # prefix cache == full recompute, block-causal


@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "sequential"])
def test_sdar_dynamic_and_sequential(sdar, strategy):
    tr = run_sdar(sdar, 9, strategy=strategy)
    decided = [p for _, c in tr.steps for p, _ in c]
    assert sorted(decided) == list(range(9, 9 + len(tr.tokens)))   # every generated position exactly once
    for (_, commit), conf in zip(tr.steps, tr.confidences):
        got = {p for p, _ in commit}
        assert len(got) >= 1 and got <= set(conf)
        if strategy == "sequential":
            assert got == {min(conf)}                           # leftmost mask, confidence ignored
        else:
            assert {p for p, c in conf.items() if c > 0.95} <= got
            rest, left = got - {p for p, c in conf.items() if c > 0.95}, set(conf) - got
            assert all(conf[p] >= conf[q] for p in rest for q in left)   # the quota: most confident first
    if strategy == "low_confidence_dynamic":
        assert tr.nfe == 1 + len(tr.steps) + len(tr.steps_per_block()) - 1
        tr2 = run_sdar(sdar, 7, strategy=strategy, denoising_steps=2)            # quota 2
        assert all(len(c) >= min(2, len(conf)) for (_, c), conf in zip(tr2.steps, tr2.confidences))
        assert sorted(p for _, c in tr2.steps for p, _ in c) == list(range(7, 24))


@pytest.mark.parametrize("T", [2, 1])
def test_sdar_quota_and_guard(sdar, T):
    L = 7                                                     # prompt tail of 3 in the first block
    tr = run_sdar(sdar, L, strategy="low_confidence_static", denoising_steps=T)
    assert tr.canvas[:L] == PROMPT[:L]
    assert sorted(p for _, c in tr.steps for p, _ in c) == list(range(L, 24))   # each position decided once
    per_block = {}
    for b, commit in tr.steps:
        per_block.setdefault(b, []).append(len(commit))
    assert per_block == {1: [1], **{b: [4 // T] * T for b in range(2, 6)}}      # min(quota, masks left) per step
    if T == 1:                                                # no shift: a whole block from its own rows
        s = 8
        rows = full_logits(sdar, tr.canvas[:s] + [SDAR_MASK_ID] * 4, 4, range(s, s + 4))
        assert [t for _, t in tr.steps[1][1]] == rows.argmax(-1).tolist()


@pytest.mark.parametrize("L", [8, 5, 11, 3, 4])           # L % B in {0, 1, B-1}, L < B, L == B
def test_sdar_prompt_lengths(sdar, L):
    tr = run_sdar(sdar, L)
    nb = -(-(L + G_SDAR) // 4)
    assert len(tr.tokens) == nb * 4 - L and tr.canvas[:L] == PROMPT[:L] and SDAR_MASK_ID not in tr.tokens
    assert sorted(p for _, c in tr.steps for p, _ in c) == list(range(L, nb * 4))
    assert tr.nfe == (1 if L >= 4 else 0) + len(tr.steps) + (nb - L // 4) - 1


def test_sdar_stop(sdar):
    full = run_sdar(sdar, 9)
    stop = full.tokens[6]                                     # a token the model does produce (block 3)
    first = full.tokens.index(stop)
    tr = sdar_generate(sdar, PROMPT[:9], mask_id=SDAR_MASK_ID, stop_ids=(stop,), gen_length=G_SDAR)
    assert tr.stopped and tr.tokens == full.tokens[:first + 1]
    b = (9 + first) // 4                                       # the stop block is completed, later ones untouched
    assert SDAR_MASK_ID not in tr.canvas[: (b + 1) * 4] and set(tr.canvas[(b + 1) * 4:]) <= {SDAR_MASK_ID}
    assert tr.nfe == 1 + len(tr.steps) + (b - 9 // 4) and tr.nfe_published == tr.nfe + 1


# ---------------------------------------------------------------- Fast-dLLM v2 reference

def v2_nfe(tr, L):
    return (1 if L >= 32 else 0) + len(tr.steps) + len(tr.ar_tokens) - (1 if L >= 32 and L % 32 == 0 else 0)


def test_v2_threshold_one(v2):
    L = 63
    tr = run_v2(v2, L, threshold=1.0)
    assert all(len(c) == 1 for _, c in tr.steps)              # strict >: p > 1 never holds
    assert len(tr.steps) == len(tr.tokens) - len(tr.ar_tokens) == 32          # 1 + 31 masks
    assert len(tr.tokens) == (L // 32 + 2) * 32 - L and tr.nfe == v2_nfe(tr, L) == 1 + 32 + 1


def test_v2_parallel_rule(v2):
    L = 33
    tr = run_v2(v2, L, threshold=THR)
    assert any(len(c) > 1 for _, c in tr.steps)
    done = set(range(L)) | {p for p, _ in tr.ar_tokens}
    for (b, commit), conf in zip(tr.steps, tr.confidences):
        got = {p for p, _ in commit}
        lo = min(conf) // 8 * 8
        assert got <= set(conf) and set(conf) <= set(range(lo, lo + 8))      # candidates: one sub-block's masks
        assert set(range(b * 32, lo)) <= done                                 # earlier sub-blocks finished
        best = max(conf.values())
        assert got == {p for p, c in conf.items() if c > THR} | {min(p for p, c in conf.items() if c == best)}
        assert all(p % 32 != 0 for p in got)                  # a block start is never a candidate (shift)
        done |= got
    assert tr.nfe == v2_nfe(tr, L) and tr.nfe_published == tr.nfe + 1


@pytest.mark.parametrize("L", [32, 33, 63, 31])          # L % B in {0, 1, B-1}; L == B; L < B (31)
def test_v2_prompt_lengths_and_ar_tokens(v2, L):
    tr = run_v2(v2, L, threshold=THR, check_cache=L == 63)   # the exact-cache audit on the cheapest run
    assert tr.cache_err < 1e-10
    assert len(tr.tokens) == (L // 32 + 2) * 32 - L and tr.canvas[:L] == PROMPT[:L] and V2_MASK_ID not in tr.tokens
    starts = [p for p, _ in tr.ar_tokens]
    assert starts == [s for s in range(32, L + len(tr.tokens), 32) if s >= L]
    for p, t in tr.ar_tokens:                                 # AR token = argmax at the previous position
        assert full_logits(v2, tr.canvas[:p], 32, [p - 1]).argmax().item() == t
    assert tr.nfe == v2_nfe(tr, L) and tr.nfe_published == tr.nfe + 1


def test_v2_stop(v2):
    full = run_v2(v2, 33, threshold=THR)
    stop = full.tokens[40]                                    # second decoded block
    first = full.tokens.index(stop)
    tr = v2_generate(v2, PROMPT[:33], mask_id=V2_MASK_ID, stop_id=stop, max_new_tokens=G_V2, threshold=THR)
    assert tr.stopped and tr.tokens == full.tokens[:first + 1] and tr.nfe_published == tr.nfe
    assert tr.nfe == 1 + len(tr.steps) + len(tr.ar_tokens) and tr.nfe < full.nfe


def test_v2_block_cache(v2):
    L = 63                                                    # block 1: one mask; block 2: AR token + 31 masks
    a = run_v2(v2, L, threshold=THR, use_block_cache=True)
    assert a.nfe == v2_nfe(a, L) and len(a.tokens) == 33           # one forward per step, like the default
    assert sorted(p for _, c in a.steps for p, _ in c) == [63] + list(range(65, 96)) and a.partial > 0
    # S = B: the sub-block forward is the whole block against prefix + fresh K/V: equal to the exact path
    L = 32
    exact = run_v2(v2, L, threshold=THR, small_block_size=32, max_new_tokens=32)
    cached = run_v2(v2, L, threshold=THR, small_block_size=32, max_new_tokens=32, use_block_cache=True)
    assert (cached.tokens, cached.steps, cached.nfe) == (exact.tokens, exact.steps, exact.nfe)
    for x, y in zip(cached.confidences, exact.confidences):
        assert x.keys() == y.keys() and all(abs(x[p] - y[p]) < 1e-10 for p in x)
