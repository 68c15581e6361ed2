"""DiffusionGemma against transformers' own implementation (DiffusionGemmaForBlockDiffusion and its
generate), float64, on tiny checkpoints written by fastdllm's writer in the published layout
(fastdllm/testing/tiny_gemma.py): the files, the encoder and decoder logits, generate token for
token with the same seed (one and several canvases, prompts shorter and longer than the sliding
window), the sampler's stop and end-of-text paths, batches equal to their rows alone, the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import TASKS, prompt_of
from safetensors.torch import load_file

from fastdllm.checkpoints import loading
from fastdllm.testing.tiny_gemma import write_diffusion_gemma
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.decode.events import StepEvent

transformers = pytest.importorskip("transformers")
HF = getattr(transformers, "DiffusionGemmaForBlockDiffusion", None)
pytestmark = [pytest.mark.sweep, pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(HF is None, reason="transformers without DiffusionGemma (>= 5.8)")]

C, STEPS, WINDOW = 16, 12, 8          # canvas, denoising steps and sliding window of the fixture


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    return write_diffusion_gemma(tmp_path_factory.mktemp("ckpt") / "tiny-diffusion-gemma", canvas_length=C,
                                 max_denoising_steps=STEPS, sliding_window=WINDOW, dtype=torch.float64)


@pytest.fixture(scope="module")
def ours(gemma_dir):
    return loading.load(gemma_dir, dtype="fp64")


@pytest.fixture(scope="module")
def theirs(gemma_dir):
    # eager experts: transformers' default grouped kernel has no float64
    return HF.from_pretrained(gemma_dir, dtype=torch.float64, experts_implementation="eager").eval()

IDS = dict(seed=None, low=110, high=500)          # random prompts: ordinary ids of the tiny vocabulary


def config(gen_len: int, **kw) -> DecodeConfig:
    return DecodeConfig(**{**dict(gen_len=gen_len, block_len=C, rule="eb_sampler", denoise_steps=STEPS,
                                  early_stop=False), **kw})


def test_files_as_published(gemma_dir, theirs):
    c = json.loads((gemma_dir / "config.json").read_text())
    assert (c["model_type"], c["architectures"], c["canvas_length"]) == ("diffusion_gemma",
                                                                        ["DiffusionGemmaForBlockDiffusion"], C)
    text = c["text_config"]
    assert "per_layer_config" not in text and (text["global_head_dim"], text["num_global_key_value_heads"]) == (32, 1)
    gen = json.loads((gemma_dir / "generation_config.json").read_text())
    assert gen["sampler_config"] == {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1}
    assert gen["eos_token_id"] == [1, 106, 50] and (gen["t_max"], gen["t_min"]) == (0.8, 0.4)
    tensors = load_file(str(gemma_dir / "model.safetensors"))
    text_names = {k for k in tensors if not k.startswith(("model.encoder.vision_tower", "model.encoder.embed_vision"))}
    expected = {k for k in theirs.state_dict() if not k.startswith(("model.encoder.vision_tower", "model.encoder.embed_vision"))
                and not k.startswith("lm_head") and not (k.startswith("model.encoder.") and not k.endswith("layer_scalar"))}
    assert text_names == expected                                  # every text tensor, under its published name
    assert tensors["model.decoder.layers.0.experts.gate_up_proj"].shape == (4, 32, 32)      # (E, 2I, d)
    assert "model.decoder.layers.2.self_attn.v_proj.weight" not in tensors              # full layer: k_eq_v
    assert any(k.startswith("model.encoder.vision_tower") for k in tensors)             # present, never read


def test_special_tokens_and_template(ours):
    assert (ours.specials.mask, ours.specials.pad, ours.specials.stops) == (-1, 0, (1, 106, 50))   # no mask: noise
    off = ours.tokenizer.decode(ours.encode("hi"))
    assert off == "<bos><|turn>user\nhi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"


@pytest.mark.parametrize("length", [5, 11, 20])            # shorter and longer than the sliding window (8)
def test_encoder_and_decoder_logits_equal_transformers(ours, theirs, length):
    from transformers import DynamicCache

    prompt = torch.tensor([prompt_of(length, **IDS)])
    g = torch.Generator().manual_seed(length)
    canvas, second = torch.randint(0, 512, (1, C), generator=g), torch.randint(0, 512, (1, C), generator=g)
    previous = torch.randn(1, C, 512, generator=g, dtype=torch.float64)
    with torch.no_grad():
        cache = DynamicCache(config=theirs.config.get_text_config(decoder=True))
        theirs.model.encoder(input_ids=prompt, cache=cache)
        expected = [theirs(decoder_input_ids=canvas, cache=cache).logits,
                    theirs(decoder_input_ids=canvas, cache=cache, self_conditioning_logits=previous).logits]
        theirs.model.encoder(input_ids=canvas, cache=cache)
        expected.append(theirs(decoder_input_ids=second, cache=cache).logits)
        mine = ours.model.new_cache(torch.ones(1, length + 2 * C, dtype=torch.bool))
        ours.model.encode(prompt, 0, mine)
        got = [ours.model.denoise(canvas, length, mine, None), ours.model.denoise(canvas, length, mine, previous)]
        ours.model.encode(canvas, length, mine)
        got.append(ours.model.denoise(second, length + C, mine, None))
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype == torch.float32                 # both soft-cap in fp32
        assert (a - b).abs().max().item() <= 1e-9


def hf_generate(model, prompt: list[int], gen_len: int, seed: int) -> list[int]:
    torch.manual_seed(seed)
    with torch.no_grad():
        return model.generate(torch.tensor([prompt]), max_new_tokens=gen_len).sequences[0, len(prompt):].tolist()


@pytest.mark.parametrize("length, gen_len, seed", [(5, C, 0), (11, 3 * C, 1), (3, 2 * C, 2), (20, 2 * C, 3)])
def test_generate_equals_transformers_generate(ours, theirs, length, gen_len, seed):
    prompt = prompt_of(length, **IDS)
    expected = hf_generate(theirs, prompt, gen_len, seed)
    steps = []
    result = run(ours.decoder, [prompt], config(gen_len, seed=seed, early_stop=True),   # transformers stops
                 on_event=lambda e: steps.append(e) if isinstance(e, StepEvent) else None)
    canvases = len(expected) // C                                  # transformers ends after a canvas with a stop id
    stop = next((i for i, t in enumerate(expected) if t in ours.specials.stops), len(expected))
    assert result.canvas[0, :stop + 1].tolist() == expected[:stop + 1]   # it pads what follows the stop
    assert result.ids[0] == expected[:stop] and result.blocks_decoded == canvases
    assert result.steps == [[STEPS] * canvases]                    # random weights never stop a canvas early
    assert result.nfe == len(steps) + canvases                     # the decoder steps and the encoder passes
    assert any(0 < int(e.committed.sum()) < C for e in steps)       # the bound keeps some, renoises the rest


# --- the sampler's own paths, on logits both implementations are given --------------------------

def peaked(positions: torch.Tensor, vocab: int, eos_at: int | None) -> torch.Tensor:
    """(B, C, V) fp32 logits peaked on a token of each position (the end of text at `eos_at`)."""
    target = (positions * 7 + 120) % (vocab - 120) + 120
    if eos_at is not None:
        target = torch.where(positions == eos_at, torch.ones_like(target), target)
    return torch.nn.functional.one_hot(target, vocab).float() * 40.0


def inject(ours, theirs, monkeypatch, eos_at):
    from transformers.modeling_outputs import CausalLMOutput

    def their_forward(decoder_input_ids=None, decoder_position_ids=None, **_):
        positions = decoder_position_ids.expand(decoder_input_ids.shape[0], -1).long()
        return CausalLMOutput(logits=peaked(positions, 512, eos_at))

    def our_denoise(canvas, start, cache, previous):
        return peaked(cache.positions[:, start:start + canvas.shape[1]], 512, eos_at)

    monkeypatch.setattr(theirs, "forward", their_forward)
    monkeypatch.setattr(ours.model, "denoise", our_denoise)


@pytest.mark.parametrize("stability, stop_at", [(1, 2), (0, 1), (3, 4)])
def test_a_stable_confident_canvas_stops_as_in_transformers(ours, theirs, monkeypatch, stability, stop_at):
    inject(ours, theirs, monkeypatch, eos_at=None)
    monkeypatch.setattr(theirs.generation_config, "stability_threshold", stability)
    prompt = prompt_of(6, **IDS)
    expected = hf_generate(theirs, prompt, 2 * C, seed=4)
    result = run(ours.decoder, [prompt], config(2 * C, seed=4, stability_steps=stability))
    assert result.canvas[0].tolist() == expected
    assert result.steps == [[stop_at, stop_at]]


def test_an_end_token_inside_a_canvas_ends_the_answer(ours, theirs, monkeypatch):
    inject(ours, theirs, monkeypatch, eos_at=6 + C + 5)            # position 5 of the second canvas
    prompt = prompt_of(6, **IDS)
    expected = hf_generate(theirs, prompt, 4 * C, seed=5)
    assert len(expected) == 2 * C and expected[C + 5] == 1 and set(expected[C + 6:]) == {0}   # padded after it
    result = run(ours.decoder, [prompt], config(4 * C, seed=5, early_stop=True))
    assert result.ids[0] == expected[:C + 5] and result.blocks_decoded == 2 and result.early_stopped


def test_a_batch_decodes_each_row_as_alone(ours):
    prompts = [prompt_of(n, **IDS) for n in (5, 11, 3)]
    cfg = config(2 * C, seed=7)
    batch = run(ours.decoder, prompts, cfg)
    for row, prompt in enumerate(prompts):
        alone = run(ours.decoder, [prompt], cfg)
        assert batch.canvas[row].tolist() == alone.canvas[0].tolist() and batch.steps[row] == alone.steps[0]


def test_a_stopped_row_waits_without_drawing(ours, monkeypatch):
    """One row stops early (peaked logits), the other does not (flat logits): each equals itself alone."""
    def our_denoise(canvas, start, cache, previous):
        logits = peaked(cache.positions[:, start:start + canvas.shape[1]], 512, None)
        logits[1:] = 0.0                                           # later rows: flat, never confident
        return logits

    monkeypatch.setattr(ours.model, "denoise", our_denoise)
    prompts = [prompt_of(6, **IDS), prompt_of(9, **IDS)]
    batch = run(ours.decoder, prompts, config(C, seed=8))
    assert batch.steps == [[2], [STEPS]]
    assert batch.canvas[0].tolist() == run(ours.decoder, prompts[:1], config(C, seed=8)).canvas[0].tolist()


# --- the family in the CLI and its refusals -----------------------------------------------------

def test_generate_through_the_cli_uses_the_family_profile(gemma_dir):
    from cli_runner import invoke

    r = invoke("generate", "-m", gemma_dir, "--json", "-n", str(2 * C), "def f(x):")
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["profile"] == "diffusion-gemma" and record["config"]["rule"] == "eb_sampler"
    assert (record["config"]["block_len"], record["config"]["denoise_steps"]) == (C, STEPS)   # from the checkpoint
    assert record["steps_per_canvas"] == [STEPS, STEPS] and record["nfe"] == 2 * STEPS + 2
    for args, words in ((["--rule", "threshold"], "its rule is eb_sampler"), (["--suffix", "x"], "cannot fill holes")):
        r = invoke("generate", "-m", gemma_dir, "-n", str(C), *args, "def f(x):")
        assert r.exit_code != 0 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.slow
def test_serve_batches_requests_and_answers_each_as_generate(gemma_dir):
    """Three requests at once, one of them streamed by step: each answer is `generate`'s for the same
    prompt and seed (rows keep their own random streams across the server's batches)."""
    import asyncio

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from serve_process import ServerProcess
    from cli_runner import invoke

    prompts = ["def f(x):", "import os", "class A:"]
    server = ServerProcess("-m", gemma_dir, "--dtype", "fp64", "--max-batch", "4")
    try:
        async def ask(http, prompt, seed):
            body = {"model": gemma_dir.name, "prompt": prompt, "max_tokens": 2 * C, "seed": seed}
            return (await http.post(server.v1 + "/completions", json=body)).json()

        async def everyone():
            async with httpx.AsyncClient(timeout=300) as http:
                return await asyncio.gather(*(ask(http, p, i) for i, p in enumerate(prompts)))

        answers = asyncio.run(everyone())
        body = {"model": gemma_dir.name, "prompt": prompts[0], "max_tokens": C, "stream": True,
                "fastdllm": {"steps": True}}
        with httpx.stream("POST", server.v1 + "/completions", json=body, timeout=300) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    finally:
        assert server.stop() == 0, server.log
    for i, (prompt, answer) in enumerate(zip(prompts, answers)):
        record = json.loads(invoke("generate", "-m", gemma_dir, "--dtype", "fp64", "--json", "--raw", "-n", str(2 * C),
                                "--seed", str(i), prompt).stdout)
        assert answer.get("fastdllm", {}).get("completion_ids") == record["ids"], (prompt, answer)
    assert sum('"step"' in line for line in lines) >= 2               # renoising steps streamed


def test_info(gemma_dir):
    from cli_runner import invoke

    info = json.loads(invoke("info", gemma_dir, "--json").stdout)
    assert info["family"] == "diffusion_gemma" and info["mask_id"] == -1
    assert 0 < info["active_parameters"] < info["parameters"]             # 2 of 4 experts per token
    # per token: K and V of every layer, bf16; the full layer's head (32) is twice the sliding ones' (16)
    assert info["kv_bytes_per_token_bf16"] == 2 * 2 * (2 * 2 * 16 + 1 * 32)
    assert list(info["memory"]) == ["bf16", "8bit", "4bit"]          # 8/4-bit: tests/quant/test_gemma_quantized.py


def test_bench_rows_vary_the_sampler(gemma_dir, ours):
    from cli_runner import invoke

    r = invoke("bench", "-m", gemma_dir, "--dtype", "fp64", "-n", str(C), "--n-prompts", "1", "--warmup", "0",
            "--prompt-set", "code", "-r", "1", "--raw", "-o", "json")
    assert r.exit_code == 0, r.stderr
    records = {x["config"]: x for x in json.loads(r.stdout)["records"]}
    assert list(records) == ["baseline", "fewer-steps", "looser-bound"]
    assert (records["fewer-steps"]["rule"], records["looser-bound"]["entropy_bound"]) == ("eb_sampler", 0.5)
    assert records["baseline"]["nfe"] == STEPS + 1 and records["fewer-steps"]["nfe"] == 16 + 1


@pytest.mark.slow
def test_eval_runs_generation_tasks_and_refuses_likelihood(gemma_dir, tmp_path):
    pytest.importorskip("lm_eval")
    from cli_runner import invoke

    out = tmp_path / "r.json"
    r = invoke("eval", "-m", gemma_dir, "--dtype", "fp64", "--include-path", TASKS, "--tasks", "tiny_next_line",
            "--limit", "2", "-n", str(C), "--output", out)
    assert r.exit_code == 0, r.stderr
    record = json.loads(out.read_text())[0]
    assert record["profile"] == "diffusion-gemma" and record["answers"] == 2 and record["config"]["rule"] == "eb_sampler"
    r = invoke("eval", "-m", gemma_dir, "--include-path", TASKS, "--tasks", "tiny_choice", "--limit", "2")
    assert r.exit_code == 1 and "no Monte Carlo likelihood" in r.stderr


def test_the_template_thinking_switch(ours, gemma_dir):
    from cli_runner import invoke

    on = ours.tokenizer.decode(ours.encode("hi", thinking=True))
    assert on == "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nhi<turn|>\n<|turn>model\n"
    assert ours.encode("hi", thinking=False) == ours.encode("hi")                 # off is the template's default
    record = json.loads(invoke("generate", "-m", gemma_dir, "--json", "--think", "-n", str(C), "hi").stdout)
    assert record["prompt_tokens"] == len(ours.encode("hi", thinking=True))
    r = invoke("generate", "-m", gemma_dir, "--raw", "--think", "-n", str(C), "hi")
    assert r.exit_code == 1 and "not with --raw" in r.stderr
