"""The mixture-of-experts families, LLaDA2.x (`llada2_moe`, block-causal) and LLaDA-MoE (`llada` +
`LLaDAMoEModelLM`, bidirectional), against the independent float64 transcriptions of their
reference forwards and decoders (tests/references/reference_moe.py) on tiny checkpoints in the published
formats (fastdllm/testing/tiny_moe.py): logits and router decisions per layer, committed (position, token)
pairs at every step, NFE; cache modes; batches; the CLI; 8/4-bit loading; one-line errors."""

from __future__ import annotations

import json
import shutil

import pytest
import reference_moe as ref
import torch
from helpers import prompt_of
from mask_heavy import heavy_copy, max_mask_probability
from moe_trace import decode, our_logits
from cli_runner import invoke

from fastdllm.checkpoints import loading
from fastdllm.testing.tiny_moe import write_llada2_moe, write_llada_moe
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.errors import UserError

# name -> (writer, its overrides, naive reference class): the docs' §8 fixtures, a second with the
# other options (biases, no shared expert / a shared expert on the layer, dense layers, GQA, bias)
FIXTURES = {
    "llada2": (write_llada2_moe, {}, ref.NaiveLLaDA2),
    "llada2_b": (write_llada2_moe, dict(use_bias=True, use_qkv_bias=True, num_shared_experts=None,
                                        first_k_dense_replace=0, sharded=False), ref.NaiveLLaDA2),
    "llada2_no_qk_norm": (write_llada2_moe, dict(use_qk_norm=False), ref.NaiveLLaDA2),
    "llada_moe": (write_llada_moe, {}, ref.NaiveLLaDAMoE),
    "llada_moe_b": (write_llada_moe, dict(num_key_value_heads=2, shared_expert_intermediate_size=48,
                                          moe_layer_freq=[0, 1], moe_router_enable_expert_bias=True), ref.NaiveLLaDAMoE),
}


HEAVY = "_heavy_mask"        # a fixture's name + HEAVY: its copy whose mask takes real probability
HEAVY_WORD_PROMPT = {"llada2": 5, "llada_moe": 13}   # the prompt length the mask's word is chosen on

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made and name.endswith(HEAVY):        # tests/mask_heavy.py
            base, naive = get(name.removesuffix(HEAVY))
            length = HEAVY_WORD_PROMPT[name.removesuffix(HEAVY)]
            canvas = prompt_of(length, seed=length) + [base.specials.mask] * 32
            heavy = heavy_copy(base, tmp_path_factory.mktemp("heavy") / name, canvas)
            assert max_mask_probability(heavy, canvas) > 0.05   # the fixture does not hide the normaliser
            made[name] = (heavy, type(naive)(heavy.path))
        if name not in made:
            writer, overrides, naive = FIXTURES[name]
            path = writer(tmp_path_factory.mktemp("ckpt") / name, **overrides)
            made[name] = (loading.load(path, dtype="fp64"), naive(path))
        ref.BANNED[:] = [made[name][0].specials.mask]         # fastdllm never predicts the mask id (Q5)
        return made[name]
    return get


@pytest.mark.parametrize("name", list(FIXTURES))
def test_logits_and_router_decisions_equal_the_reference(checkpoints, name):
    lm, naive = checkpoints(name)
    ids = prompt_of(45)                                         # not a whole number of blocks
    logits, routes = our_logits(lm, ids)
    expected = naive.forward(ids, block_length=32)
    assert torch.allclose(logits, expected, rtol=0, atol=1e-10)
    assert len(routes) == len(naive.routes) > 0
    for (weights, experts), route in zip(routes, naive.routes):
        assert experts.tolist() == [list(e) for e in route.experts]           # same experts, same order
        assert torch.allclose(weights, torch.tensor(route.weights, dtype=torch.float64), rtol=0, atol=1e-12)
    changed, _ = our_logits(lm, ids[:-1] + [ids[-1] + 1])
    bidirectional = lm.model.attention.kind == "bidirectional"
    moved = float((changed[:32] - logits[:32]).abs().max())     # rounding aside (experts group other rows)
    assert (moved > 1e-6) == bidirectional                     # block-causal: block 0 never sees position 44


def test_each_expert_runs_once_on_its_own_tokens(checkpoints):
    """Tokens are grouped by expert: an expert that got n (token, slot) pairs runs once on n rows,
    one that got none never runs; no dense evaluation of all experts."""
    lm, _ = checkpoints("llada2")
    rows = {}
    hooks = [m.register_forward_hook(lambda _m, i, _o, name=name: rows.setdefault(name, []).append(i[0].shape[0]))
             for name, m in lm.model.named_modules() if ".experts." in name and name.count(".") == 5]
    _, routes = our_logits(lm, prompt_of(45))
    for h in hooks:
        h.remove()
    for layer, (_, experts) in zip((1, 2), routes):
        counts = torch.bincount(experts.flatten(), minlength=8).tolist()
        ran = {int(n.split(".")[-1]): r for n, r in rows.items() if n.startswith(f"model.layers.{layer}.")}
        assert ran == {e: [n] for e, n in enumerate(counts) if n}


@pytest.mark.parametrize("name, length, per_block, threshold", [
    ("llada2", 5, 32, 0.7), ("llada2", 32, 32, 0.95), ("llada2", 33, 16, 0.7), ("llada2", 63, 8, 0.7),
    ("llada2", 31, 16, 0.95), ("llada2_b", 33, 32, 0.7), ("llada2_b", 1, 8, 0.7),
    ("llada2_heavy_mask", 5, 32, 0.7), ("llada2_heavy_mask", 32, 32, 0.95), ("llada2_heavy_mask", 33, 16, 0.7),
    ("llada2_heavy_mask", 63, 8, 0.7)])
def test_llada2_decodes_as_its_generate(checkpoints, name, length, per_block, threshold):
    """H1's generate (docs/specs/llada2-moe.md §6.1) with the dynamic rule: the same commits at every step
    under every cache mode (block-causal: exact); NFE = H1's + one store pass per block kept (Q7)."""
    lm, naive = checkpoints(name)
    prompt = prompt_of(length, seed=length)
    gen_len = 32 if length != 31 else 64
    trace = ref.llada2_generate(naive, prompt, mask_id=lm.specials.mask, eos_id=lm.specials.stops[0],
                                gen_length=gen_len, steps=per_block, threshold=threshold)
    assert not trace.stopped                                    # the comparison covers whole canvases
    for cache in ("prefix", "none", "dual"):
        cfg = DecodeConfig(gen_len=gen_len, block_len=32, rule="dynamic", threshold=threshold,
                           steps=per_block * gen_len // 32, cache=cache, early_stop=False)
        steps, stores, result, _ = decode(lm, [prompt], cfg)
        assert steps[0] == [pairs for _, pairs in trace.steps if pairs]
        assert result.canvas[0].tolist() == trace.canvas[length:]
        assert stores == len(trace.blocks) - 1 + (length >= 32)    # after each block but the last; the prompt's
        assert result.nfe == trace.nfe + stores


@pytest.mark.parametrize("name, length, threshold", [("llada2", 11, 0.8), ("llada2", 32, 0.9), ("llada2", 33, 0.9), ("llada2_b", 5, 0.8),
                                                     ("llada2_heavy_mask", 5, 0.7), ("llada2_heavy_mask", 33, 0.9)])
def test_llada2_decodes_as_dinfer(checkpoints, name, length, threshold):
    """D1's threshold decoder (docs/specs/llada2-moe.md 6.3), our `dinfer` rule: the same commits at every
    step under every cache mode; NFE = D1's without its unrolled extra forwards, plus the store passes."""
    lm, naive = checkpoints(name)
    prompt = prompt_of(length, seed=length)
    trace = ref.llada2_generate(naive, prompt, mask_id=lm.specials.mask, eos_id=lm.specials.stops[0],
                                gen_length=32, threshold=threshold, rule="dinfer")
    assert not trace.stopped
    assert any(len(pairs) > 1 for _, pairs in trace.steps)      # parallel commits happen
    for cache in ("prefix", "none", "dual"):
        cfg = DecodeConfig(gen_len=32, block_len=32, rule="dinfer", threshold=threshold, cache=cache, early_stop=False)
        steps, stores, result, _ = decode(lm, [prompt], cfg)
        assert steps[0] == [pairs for _, pairs in trace.steps]
        assert result.canvas[0].tolist() == trace.canvas[length:]
        assert result.nfe == trace.nfe + stores


@pytest.mark.parametrize("name, length, steps", [("llada_moe", 13, 64), ("llada_moe", 40, 32), ("llada_moe_b", 7, 32),
                                                 ("llada_moe_heavy_mask", 13, 64), ("llada_moe_heavy_mask", 40, 32)])
def test_llada_moe_decodes_as_the_model_card(checkpoints, name, length, steps):
    """The card's generate (docs/specs/llada-moe.md §5.1): our `fixed` rule without a cache, step by step."""
    lm, naive = checkpoints(name)
    prompt = prompt_of(length, seed=length)
    trace = ref.llada_moe_generate(naive, prompt, mask_id=lm.specials.mask, gen_length=64, block_length=32, steps=steps)
    cfg = DecodeConfig(gen_len=64, block_len=32, rule="fixed", steps=steps, cache="none", early_stop=False)
    got, _, result, _ = decode(lm, [prompt], cfg)
    assert got[0] == [pairs for _, pairs in trace.steps if pairs]
    assert result.canvas[0].tolist() == trace.canvas[length:] and result.nfe == trace.nfe == steps


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_llada_moe_cache_is_exact_right_after_a_refresh(checkpoints, cache):
    """Bidirectional: the v1 caches are approximate inside a block, exact at its first step (a
    refresh of the whole canvas): there our tokens and confidences are the reference's on that canvas."""
    lm, naive = checkpoints("llada_moe_b")
    prompt, mask = prompt_of(9), lm.specials.mask
    canvas = prompt + [mask] * 64
    cfg = DecodeConfig(gen_len=64, block_len=32, rule="threshold", threshold=0.7, cache=cache, early_stop=False)
    events = decode(lm, [prompt], cfg)[3]
    for e in events:
        positions = [int(p) + len(prompt) for p in e.positions[0]]
        if e.step == 0:
            tokens, conf = ref.greedy(naive.forward(canvas, rows=positions))
            masked = [canvas[p] == mask for p in positions]
            assert [t for t, m in zip(e.tokens[0].tolist(), masked) if m] == [t for t, m in zip(tokens, masked) if m]
            assert torch.allclose(e.confidences[0][masked], torch.tensor(conf, dtype=torch.float64)[masked], atol=1e-10)
        for p, t, c in zip(positions, e.tokens[0].tolist(), e.committed[0].tolist()):
            canvas[p] = t if c else canvas[p]
    assert sum(e.step > 0 for e in events) > 0 and mask not in canvas    # cached steps ran; all decoded


@pytest.mark.parametrize("name, lengths, cache", [("llada2", [3, 40, 33], "prefix"), ("llada2", [3, 40, 33], "none"),
                                                  ("llada_moe", [9, 3, 20], "none"), ("llada_moe", [9, 3, 20], "dual")])
def test_a_batch_decodes_each_row_as_alone(checkpoints, name, lengths, cache):
    lm, _ = checkpoints(name)
    cfg = DecodeConfig(gen_len=32, block_len=32, rule="dynamic", threshold=0.7, cache=cache, early_stop=False)
    prompts = [prompt_of(n, seed=i) for i, n in enumerate(lengths)]
    batch = decode(lm, prompts, cfg)[2]
    for row, prompt in enumerate(prompts):
        alone = decode(lm, [prompt], cfg)[2]
        assert batch.canvas[row, :alone.canvas.shape[1]].tolist() == alone.canvas[0].tolist()


@pytest.mark.parametrize("name, profile, attention, rule", [("llada2", "llada2", "block-causal(32)", "dynamic"),
                                                            ("llada2", "llada2-dinfer", "block-causal(32)", "dinfer"),
                                                            ("llada_moe", "llada-moe", "bidirectional", "threshold")])
def test_generate_and_info_through_the_cli(checkpoints, name, profile, attention, rule):
    lm, _ = checkpoints(name)
    assert lm.tokenizer.decode(lm.encode("hi")).endswith("<role>HUMAN</role>hi<|role_end|><role>ASSISTANT</role>")
    chosen = [] if profile in ("llada2", "llada-moe") else ["--profile", profile]   # the family's default, or named
    record = json.loads(invoke("generate", "-m", lm.path, *chosen, "--json", "-n", "32", "--raw", "def f(x):").stdout)
    assert record["profile"] == profile and record["config"]["block_len"] == 32 and record["config"]["rule"] == rule
    assert record["model"]["attention"] == attention and record["nfe"] >= 1 and len(record["ids"]) <= 32
    info = json.loads(invoke("info", lm.path, "--json").stdout)
    assert info["mask_id"] == lm.specials.mask and info["end_of_turn_id"] in lm.specials.stops
    assert info["architectures"] == [lm.model.config.architectures[0]] and info["family"] == lm.family
    assert 0 < info["active_parameters"] < info["parameters"]
    memory = info["memory"]
    assert memory["bf16"]["weights"] > memory["8bit"]["weights"] > memory["4bit"]["weights"] > 0
    text = invoke("info", lm.path).stdout
    assert "active per token" in text and all(f"memory {k}" in text for k in ("bf16", "8bit", "4bit"))


@pytest.mark.parametrize("quantize", ["8bit", "4bit"])
@pytest.mark.parametrize("name", ["llada2", "llada_moe_b"])
def test_quantized_moe_on_cpu(checkpoints, name, quantize):
    path = checkpoints(name)[0].path
    lm = loading.load(path, dtype="bf16", quantize=quantize)
    moe = next(m for n, m in lm.model.named_modules() if n.endswith(".mlp") and hasattr(m, "experts"))
    assert type(moe.experts[0].gate_proj).__module__.startswith("bitsandbytes")   # experts quantized
    assert moe.gate.weight.dtype == torch.bfloat16                                 # the router not
    bias = getattr(moe.gate, "expert_bias", getattr(moe, "expert_bias", None))
    assert bias is not None and bias.dtype == torch.float32                        # kept at fp32 (Q8)
    result = run(lm.decoder, [prompt_of(5)], DecodeConfig(gen_len=32, block_len=32, early_stop=False))
    assert result.nfe >= 2 and lm.specials.mask not in result.canvas[0].tolist()


def _variant(checkpoints, tmp_path, name, **changes):
    path = shutil.copytree(checkpoints(name)[0].path, tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **changes}))
    return path


def test_bailing_moe_v2_is_the_same_family_and_ling_models_are_refused(checkpoints, tmp_path):
    lm, _ = checkpoints("llada2")
    same = loading.load(_variant(checkpoints, tmp_path, "llada2", model_type="bailing_moe_v2"), dtype="fp64")
    assert torch.equal(our_logits(same, prompt_of(8))[0], our_logits(lm, prompt_of(8))[0])
    with pytest.raises(UserError, match="unsupported architecture"):
        loading.load(_variant(checkpoints, tmp_path, "llada2", model_type="bailing_moe_v2",
                              architectures=["BailingMoeV2ForCausalLM"]))


def _fused_experts(checkpoints, tmp_path):
    """dInfer's conversion: per layer w1 = stacked cat(gate, up), w2 = stacked down; not published."""
    from safetensors.torch import load_file, save_file

    path = shutil.copytree(checkpoints("llada2_b")[0].path, tmp_path / "fused")
    tensors = load_file(path / "model.safetensors")
    for layer in range(3):
        p = f"model.layers.{layer}.mlp."
        names = sorted({n for n in tensors if n.startswith(p + "experts.")})
        if names:
            tensors[p + "w1"] = torch.stack([torch.cat([tensors.pop(f"{p}experts.{j}.gate_proj.weight"),
                                                        tensors.pop(f"{p}experts.{j}.up_proj.weight")]) for j in range(8)])
            tensors[p + "w2"] = torch.stack([tensors.pop(f"{p}experts.{j}.down_proj.weight") for j in range(8)])
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def test_malformed_or_unpublished_moe_checkpoints_fail_in_one_line(checkpoints, tmp_path):
    cases = [
        (_variant(checkpoints, tmp_path, "llada2", num_experts_per_tok=9), "num_experts_per_tok 9 is not in 1..num_experts (8)"),
        (_variant(checkpoints, tmp_path, "llada2", n_group=3), "does not split into n_group 3 groups"),
        (_variant(checkpoints, tmp_path, "llada2", num_experts_per_tok=5, topk_group=2), "exceeds the 4 experts"),
        (_variant(checkpoints, tmp_path, "llada2", num_key_value_heads=0), "num_key_value_heads is required"),
        (_variant(checkpoints, tmp_path, "llada2", norm_head=True), "config.json sets norm_head=True"),
        (_variant(checkpoints, tmp_path, "llada2", use_qk_norm=False), "unexpected tensors"),
        (_variant(checkpoints, tmp_path, "llada2", model_type="llada2_moe_veomni"), "LLaDA2's training format"),
        (_variant(checkpoints, tmp_path, "llada_moe", num_experts_per_tok=9), "num_experts_per_tok 9 is not in"),
        (_variant(checkpoints, tmp_path, "llada_moe", num_experts=None), "required keys missing: num_experts"),
        (_variant(checkpoints, tmp_path, "llada_moe", moe_layer_freq=[1]), "moe_layer_freq must list"),
        (_variant(checkpoints, tmp_path, "llada_moe", routed_scaling_factor=2.5), "routed_scaling_factor=2.5"),
        (_variant(checkpoints, tmp_path, "llada_moe", architectures=["FusedLLaDAMoEModelLM"]), "unsupported architecture"),
        (_fused_experts(checkpoints, tmp_path), "experts not in the published layout"),
    ]
    for path, message in cases:
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")) as err:
            loading.load(path)
        assert "\n" not in str(err.value)
    r = invoke("generate", "-m", cases[0][0], "hi")
    assert r.exit_code == 1 and "num_experts_per_tok 9" in r.stderr and len(r.stderr.strip().splitlines()) == 1
