"""RND1 (`rnd1`) against the independent float64 transcription of its forward and of its authors'
`diffusion_sample` (tests/references/reference_rnd1.py), on tiny checkpoints in the published layout
(fastdllm/testing/tiny_rnd1.py): the files and the trust decision, logits and every layer's router
decisions (the transcription itself against transformers' Qwen3-MoE under a full mask), committed
(position, token) pairs at every step and NFE for the entropy schedule (greedy and seeded sampling),
RND1's own canvas (a reserved last slot), prefix/suffix infilling, the eos at the end, a probable
mask; the CLI, `fastdllm info`, 8/4-bit on CPU, one-line errors."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import reference_rnd1 as ref
import torch
from mask_heavy import heavy_copy, max_mask_probability
from cli_runner import invoke
from helpers import QWEN_IDS, prompt_of

from fastdllm.checkpoints import loading
from fastdllm.testing.tiny_rnd1 import (
    EOS_ID,
    MASK_ID,
    PAD_ID,
    SIZE_KEYS,
    rnd1_config,
    write_rnd1,
)
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import generate, run
from fastdllm.decode.events import Result, StepEvent
from fastdllm.errors import UserError

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]
HEAVY = "heavy_mask"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made and name == HEAVY:
            lm, _ = get("main")
            canvas = prompt_of(5, **QWEN_IDS) + [MASK_ID] * 12 + [PAD_ID]
            heavy = heavy_copy(lm, tmp_path_factory.mktemp("heavy") / name, canvas)
            assert max_mask_probability(heavy, canvas) > 0.05          # the normaliser is not hidden
            made[name] = (heavy, ref.NaiveRND1(heavy.path))
        if name not in made:
            path = write_rnd1(tmp_path_factory.mktemp("ckpt") / f"rnd1-{name}", sharded=name == "main")
            made[name] = (loading.load(path, dtype="fp64"), ref.NaiveRND1(path))
        return made[name]
    return get


def ours(lm, row, holes, cfg):
    """Decode one canvas row through the engine: (per step the sorted [(position, token)] it
    committed, the Result). `holes` None: `row` is the prompt (the engine's own canvas)."""
    steps, result = [], None
    events = generate(lm.decoder, [row], cfg, holes=holes)
    start = holes[0][0] if holes else len(row)
    for event in events:
        if isinstance(event, Result):
            result = event
        elif isinstance(event, StepEvent):
            steps.append(sorted((int(p) + start, int(t)) for p, t, c in
                                zip(event.positions[0], event.tokens[0], event.committed[0]) if c))
    return steps, result


def config(n, steps, eb_gamma=None, **kw):
    rule = {"rule": "entropy_schedule", "confidence": "entropy"} if eb_gamma is None else \
        {"rule": "eb_gamma", "confidence": "logprob", "entropy_bound": eb_gamma}
    return DecodeConfig(gen_len=n, block_len=n, steps=steps, cache="none", **rule, **kw)


def check(lm, naive, x, maskable, steps, *, temperature=0.0, seed=0, eb_gamma=None):
    """The engine on canvas x (its masks one hole) against the transcription: every committed pair,
    the final canvas and NFE (the transcription's forwards that commit nothing are skipped)."""
    holes = [(maskable.index(True), len(maskable) - maskable[::-1].index(True))]
    n = holes[0][1] - holes[0][0]
    got, result = ours(lm, x, holes, config(n, steps, eb_gamma, temperature=temperature, seed=seed))
    draws = torch.Generator().manual_seed(seed) if temperature else None
    final, forwards, expected = ref.sample(naive, x, maskable, num_steps=steps, mask=MASK_ID, eb_gamma=eb_gamma,
                                           temperature=temperature or 1.0, greedy=not temperature, draws=draws)
    assert got == [s for s in expected if s]
    assert result.canvas[0].tolist() == final[holes[0][0]:holes[0][1]]
    assert forwards == len(expected) and result.nfe == len([s for s in expected if s])
    if all(expected) and eb_gamma is None:
        assert result.nfe == forwards == min(steps, n)     # S <= M: exactly S forwards, as the authors
    return got


# --- the files and what fastdllm trusts ---------------------------------------------------------------

def test_loads_as_published(checkpoints):
    lm, _ = checkpoints("main")
    config = json.loads((lm.path / "config.json").read_text())
    assert list(config) == list(rnd1_config())
    assert {k for k in config if config[k] != rnd1_config()[k]} == SIZE_KEYS
    assert (lm.family, lm.specials.mask, lm.specials.pad, lm.specials.stops) == ("rnd1", MASK_ID, PAD_ID, (EOS_ID,))
    assert lm.tokenizer.convert_ids_to_tokens(MASK_ID) is None        # Qwen3's tokenizer names no mask
    assert lm.info["attention"] == "bidirectional" and lm.model.logit_shift == 1
    assert lm.model.model.layers[1].mlp.gate.routing.score == "softmax_renorm"
    assert lm.model.lm_head.weight.data_ptr() != lm.model.model.embed_tokens.weight.data_ptr()   # untied
    missing = write_rnd1(lm.path.parent / "no-mask-key", drop=("mask_token_id",), sharded=False)
    assert loading.load(missing, dtype="fp64").specials.mask == MASK_ID  # the authors' default


def test_the_published_shape_has_qwen3_30b_a3b_size():
    from fastdllm.checkpoints.info import idle_expert_parameters
    from fastdllm.models.rnd1 import RND1LM, RND1Config

    config = RND1Config.from_dict(rnd1_config())
    with torch.device("meta"):
        model = RND1LM(config)
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    total = sum(t.numel() for t in model.parameters())
    assert total * 2 == 61064245248 and len(shapes) == 18867          # Qwen3-30B-A3B's bf16 bytes, tensors
    assert round((total - idle_expert_parameters(shapes, config)) / 1e9, 2) == 3.35


@pytest.mark.parametrize("changes, message", [
    ({"norm_topk_prob": False}, "norm_topk_prob False (RND1's configuration class always uses True)"),
    ({"rope_theta": 10000.0}, "rope_theta 10000.0 (RND1's configuration class always uses 1000000.0)"),
    ({"mlp_only_layers": [0]}, "mlp_only_layers [0]"),
    ({"hidden_size": 96}, "cannot load weights"),
    ({"num_experts": 6}, "cannot load weights"),
])
def test_a_config_that_contradicts_the_authors_or_the_weights_fails_in_one_line(checkpoints, tmp_path, changes, message):
    path = shutil.copytree(checkpoints("main")[0].path, tmp_path / "v")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **changes}))
    with pytest.raises(UserError, match=re.escape(message)) as err:
        loading.load(path)
    assert "\n" not in str(err.value)


# --- the forward --------------------------------------------------------------------------------------

def test_the_naive_forward_is_transformers_qwen3_moe_unmasked(checkpoints):
    """The transcription equals transformers' Qwen3-MoE on the same weights under an all-True mask."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    _, naive = checkpoints("main")
    # RND1's own keys, and its `false` for "no sliding window / rope scaling" (Qwen3MoeConfig wants None)
    drop = ("architectures", "auto_map", "model_type", "dtype", "sliding_window", "rope_scaling", "is_causal",
            "moe_backend", "num_diffusion_steps", "mask_token_id")
    c = {k: v for k, v in naive.cfg.items() if k not in drop}
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**c, attn_implementation="eager", experts_implementation="eager"))
    state, experts = {}, {}
    for key, value in naive.w.items():
        m = re.match(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(\w+)_proj\.weight", key)
        if m is None:
            state[key] = value
        elif m[3] == "gate":                                            # rows: gate | up
            experts.setdefault(m[1] + ".gate_up_proj", {})[int(m[2])] = torch.cat(
                [value, naive.w[key.replace("gate_proj", "up_proj")]])
        elif m[3] == "down":
            experts.setdefault(m[1] + ".down_proj", {})[int(m[2])] = value
    state |= {k: torch.stack([v[j] for j in range(len(v))]) for k, v in experts.items()}
    model = model.double().eval()
    model.load_state_dict(state, strict=True)
    ids = prompt_of(12, **QWEN_IDS)
    with torch.no_grad():
        theirs = model(torch.tensor([ids]), attention_mask=torch.ones(1, 1, 12, 12, dtype=torch.bool)).logits[0]
    # transformers keeps RoPE, RMSNorm and the router softmax in float32
    assert (naive.logits(ids) - theirs).abs().max() < 1e-3


def test_logits_and_router_decisions_equal_the_reference(checkpoints):
    lm, naive = checkpoints("main")
    ids = prompt_of(9, seed=3, **QWEN_IDS) + [MASK_ID] * 8 + [PAD_ID]
    routes = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: routes.append(out))
             for name, m in lm.model.named_modules() if name.endswith("mlp.gate")]
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids])).logits[0]                # unshifted, as the authors' forward
    for h in hooks:
        h.remove()
    assert torch.allclose(logits, naive.logits(ids), rtol=0, atol=1e-10)
    assert len(routes) == len(naive.routes) == 2
    for (weights, experts), route in zip(routes, naive.routes):
        assert experts.tolist() == route.experts
        assert torch.allclose(weights, torch.tensor(route.weights, dtype=torch.float64), rtol=0, atol=1e-12)
    assert len({tuple(e) for route in naive.routes for e in route.experts}) > 5
    changed = ids[:-1] + [EOS_ID]
    with torch.no_grad():
        other = lm.model(torch.tensor([changed])).logits[0]
    assert float((other[0] - logits[0]).abs().max()) > 1e-6             # bidirectional: the first sees the last


# --- decoding: diffusion_sample ---------------------------------------------------------------------

@pytest.mark.parametrize("new, steps", [(12, 12), (12, 4), (12, 5), (12, 16), (23, 22), (9, 1)])
def test_generate_as_the_authors(checkpoints, new, steps):
    """RND1's generate: prompt, new - 1 masks, the reserved last slot (pad), the entropy schedule;
    (23, 22): 22 masks in 22 steps, a step where the authors' float32 schedule unmasks two and the next one none."""
    lm, naive = checkpoints("main")
    prompt = prompt_of(6, seed=new, **QWEN_IDS)
    x, maskable = ref.canvas(prompt, seq_len=len(prompt) + new, mask=MASK_ID, pad=PAD_ID, eos=EOS_ID)
    assert x[-1] == PAD_ID and sum(maskable) == new - 1
    got = check(lm, naive, x, maskable, steps)
    if (new, steps) == (23, 22):
        assert sorted(len(s) for s in got)[-1] == 2 and len(got) == 21   # the authors: 22 forwards


@pytest.mark.parametrize("steps, temperature", [(12, 0.0), (3, 0.0), (12, 0.7)])
def test_the_entropy_bound_as_the_authors(checkpoints, steps, temperature):
    """eb_gamma: most probable first, their entropies less the largest bounded; what is left at step
    S takes its prediction. A tighter bound takes more steps; 3 steps end on the fill."""
    lm, naive = checkpoints("main")
    prompt = prompt_of(6, seed=steps, **QWEN_IDS)
    x, maskable = ref.canvas(prompt, seq_len=len(prompt) + 13, mask=MASK_ID, pad=PAD_ID, eos=EOS_ID)
    sizes = {gamma: [len(s) for s in check(lm, naive, x, maskable, steps, temperature=temperature, seed=5,
                                           eb_gamma=gamma)] for gamma in (0.05, 1.0, 20.0)}
    assert all(sum(v) == 12 for v in sizes.values())
    assert len(sizes[0.05]) >= len(sizes[1.0]) >= len(sizes[20.0]) and len(sizes[0.05]) > len(sizes[20.0])
    if steps == 3:
        assert len(sizes[0.05]) == 3 and sizes[0.05][-1] > 1          # the fill at step S


def test_the_eos_at_the_end_and_a_probable_mask(checkpoints):
    lm, naive = checkpoints("main")
    prompt = prompt_of(5, **QWEN_IDS)
    x, maskable = ref.canvas(prompt, seq_len=18, mask=MASK_ID, pad=PAD_ID, eos=EOS_ID, add_eos_at_end=True)
    assert x[-1] == EOS_ID
    check(lm, naive, x, maskable, 12)
    heavy, naive_heavy = checkpoints(HEAVY)
    x, maskable = ref.canvas(prompt, seq_len=18, mask=MASK_ID, pad=PAD_ID, eos=EOS_ID)
    check(heavy, naive_heavy, x, maskable, 12)
    check(heavy, naive_heavy, x, maskable, 4)


@pytest.mark.parametrize("steps", [10, 3])
def test_prefix_suffix_infilling_as_the_authors(checkpoints, steps):
    """generate(prefix, suffix, infill_length=11): prefix, 10 masks, suffix, the reserved pad."""
    lm, naive = checkpoints("main")
    prefix, suffix = prompt_of(4, seed=1, **QWEN_IDS), prompt_of(5, seed=2, **QWEN_IDS)
    x, maskable = ref.canvas(prefix, suffix=suffix, seq_len=4 + 11 + 5, infill_length=11, mask=MASK_ID,
                             pad=PAD_ID, eos=EOS_ID)
    assert x[4:14] == [MASK_ID] * 10 and x[14:19] == suffix and x[19] == PAD_ID
    check(lm, naive, x, maskable, steps)


def test_the_engines_own_canvas_runs_the_same_sampler(checkpoints):
    """`fastdllm generate` without the reserved slot: prompt and gen_len masks, the same loop."""
    lm, naive = checkpoints("main")
    prompt = prompt_of(7, seed=4, **QWEN_IDS)
    got, result = ours(lm, prompt, None, config(10, 5))
    x, maskable = prompt + [MASK_ID] * 10, [False] * 7 + [True] * 10
    final, forwards, expected = ref.sample(naive, x, maskable, num_steps=5, mask=MASK_ID)
    assert got == expected and result.nfe == forwards == 5
    assert result.canvas[0].tolist() == final[7:]


@pytest.mark.parametrize("temperature, steps", [(1.0, 12), (0.7, 4), (0.01, 6)])
def test_seeded_sampling_with_the_draws_injected(checkpoints, temperature, steps):
    """Sampling with the transcription's draws taken from fastdllm's generator in fastdllm's order
    (reference_rnd1's module doc); the entropies at the sampling temperature, as the authors'."""
    lm, naive = checkpoints("main")
    prompt = prompt_of(6, seed=9, **QWEN_IDS)
    x, maskable = ref.canvas(prompt, seq_len=6 + 13, mask=MASK_ID, pad=PAD_ID, eos=EOS_ID)
    first = check(lm, naive, x, maskable, steps, temperature=temperature, seed=5)
    greedy = check(lm, naive, x, maskable, steps)
    assert first != greedy or temperature == 0.01


# --- the CLI, info, quantization ---------------------------------------------------------------------

def test_generate_chat_and_info_through_the_cli(checkpoints):
    lm, naive = checkpoints("main")
    record = json.loads(invoke("generate", "-m", lm.path, "--json", "-n", "16", "--raw",
                            "Question: 1+1?\nAnswer:").stdout)
    assert record["profile"] == "rnd1" and record["model"]["attention"] == "bidirectional"
    cfg = record["config"]
    assert (cfg["rule"], cfg["confidence"], cfg["steps"], cfg["cache"], cfg["temperature"], cfg["seed"]) == (
        "entropy_schedule", "entropy", 256, "none", 0.01, 1234)
    assert cfg["block_len"] == 16                                       # one global canvas, whatever -n
    r = invoke("generate", "-m", lm.path, "-n", "16", "--block-len", "8", "--raw", "hi")
    assert r.exit_code == 2 and "must equal gen_len 16" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert record["nfe"] == 16 and len(record["ids"]) <= 16
    info = json.loads(invoke("info", lm.path, "--json").stdout)
    assert (info["family"], info["architectures"], info["mask_id"]) == ("rnd1", ["RND1"], MASK_ID)
    experts = sum(t.numel() for n, t in naive.w.items() if ".mlp.experts." in n)
    assert info["parameters"] == sum(t.numel() for t in naive.w.values())
    assert info["active_parameters"] == info["parameters"] - experts * (8 - 3) // 8
    assert "active per token" in invoke("info", lm.path).stdout


@pytest.mark.parametrize("quantize", ["8bit", "4bit"])
def test_quantized_on_cpu(checkpoints, quantize):
    lm = loading.load(checkpoints("main")[0].path, dtype="bf16", quantize=quantize)
    moe = lm.model.model.layers[1].mlp
    assert type(moe.experts[0].gate_proj).__module__.startswith("bitsandbytes")
    assert moe.gate.weight.dtype == torch.bfloat16                     # the router is not quantized
    result = run(lm.decoder, [prompt_of(5, **QWEN_IDS)], config(16, 8))
    assert result.nfe == 8 and MASK_ID not in result.canvas[0].tolist()


def test_bench_rows_for_a_whole_canvas_schedule(checkpoints):
    lm, _ = checkpoints("main")
    r = invoke("bench", "-m", lm.path, "-n", "32", "--n-prompts", "1", "--warmup", "0", "-r", "1", "--raw", "-o", "json")
    assert r.exit_code == 0, r.stderr
    records = {x["config"]: x for x in json.loads(r.stdout)["records"]}
    assert list(records) == ["baseline", "fewer-steps", "parallel", "dual+parallel"]
    assert (records["baseline"]["rule"], records["baseline"]["block_len"]) == ("entropy_schedule", 32)
    assert (records["dual+parallel"]["rule"], records["dual+parallel"]["cache"]) == ("threshold", "dual")
    assert records["dual+parallel"]["speedup"] is not None          # blocks of 32 against the canvas baseline
