"""A model split over devices (checkpoints/split.py): on a CPU, accelerate's disk offload puts the
later layers (and the head) in an offload folder while the embedding and the first layers stay in
memory. Every family the tests build commits the same tokens with the same NFE as the whole model,
float64, under every cache mode, for a batch of prompts of different lengths (left padding) and
for one prompt alone; the split's refusals are one line each."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from conftest import VARIED

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.family import family_of, read_config
from fastdllm.checkpoints.split import plan, split_of
from fastdllm.testing.tiny_blockdiff import write_fast_dllm_v2, write_sdar
from fastdllm.testing.tiny_moe import write_llada2_moe, write_llada_moe
from fastdllm.testing.tiny_random import write_dream, write_llada
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.errors import UsageError, UserError

LAYERS = 4          # enough that some stay in memory and some go to disk
# family -> (writer of a 4-layer checkpoint with varied confidences, its decoding settings)
FAMILIES = {
    "llada": (lambda out: write_llada(out, n_layers=LAYERS, **VARIED), dict(gen_len=16, block_len=8)),
    "dream": (lambda out: write_dream(out, n_layers=LAYERS, **dict(VARIED, logit_scale=4.0)),
              dict(gen_len=16, block_len=8)),
    "sdar": (lambda out: write_sdar(out, n_layers=LAYERS), dict(gen_len=16, block_len=4)),
    "fast_dllm_v2": (lambda out: write_fast_dllm_v2(out, n_layers=LAYERS, bd_size=8),
                     dict(gen_len=16, block_len=8, sub_block_len=4)),
    "llada2_moe": (lambda out: write_llada2_moe(out, num_hidden_layers=LAYERS), dict(gen_len=16, block_len=8)),
    "llada_moe": (lambda out: write_llada_moe(out, num_hidden_layers=LAYERS), dict(gen_len=16, block_len=8)),
}
PROMPTS = ["Tell me about caches.", "What is 2+2?", "Write a function that adds two numbers, then explain it."]


@pytest.fixture(scope="module", autouse=True)
def single_thread(one_thread):
    yield


def disk_budget(path: Path) -> str:
    """A --max-memory that keeps the embedding and at least one layer in memory and sends the most
    layers to disk (accelerate's planner also keeps room for the largest layer it reloads): the CPU
    budget lowered half a layer at a time from the whole model's size while a layer stays in memory."""
    from accelerate import init_empty_weights
    from accelerate.utils import compute_module_sizes

    config, cls, _ = family_of(read_config(path), path)
    config._attn_implementation = "eager"
    with init_empty_weights():
        sizes = compute_module_sizes(cls(config).to(torch.float64))
    block = max(v for k, v in sizes.items() if k.rsplit(".", 1)[-1].isdigit() and ".experts." not in k)
    found = None
    for budget in range(sizes[""], 0, -block // 2):
        device_map = plan(cls, config, torch.float64, split_of("cpu", None, f"cpu={budget}B,disk"))
        if layers_on(device_map, "cpu") and layers_on(device_map, "disk"):
            found = f"cpu={budget}B,disk"
        elif found:                                 # no layer left in memory
            break
    assert found, f"no budget splits {path.name}"
    return found


def layers_on(device_map: dict, device) -> list[str]:
    """The decoder layers the map places on `device` (names ending in a layer index)."""
    return [name for name, d in device_map.items() if d == device and name.rsplit(".", 1)[-1].isdigit()]


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    """(the whole model, the same checkpoint split between the CPU and disk), float64."""
    write, settings = FAMILIES[request.param]
    path = write(tmp_path_factory.mktemp("split") / f"tiny-{request.param}")
    whole = loading.load(path, dtype="fp64", device="cpu")
    split = loading.load(path, dtype="fp64", device="cpu", max_memory=disk_budget(path))
    yield request.param, whole, split, settings
    del whole, split
    gc.collect()


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_split_commits_what_the_whole_model_commits(pair, cache, capsys):
    family, whole, split, settings = pair
    device_map = split.model.hf_device_map
    assert layers_on(device_map, "cpu") and layers_on(device_map, "disk"), device_map    # really split
    assert any(p.is_meta for p in split.model.parameters())                                # weights on disk
    assert {t.device.type for t in split.model.new_cache(torch.ones(1, 4, dtype=torch.bool)).keys} == {"cpu"}
    cfg = DecodeConfig(cache=cache, rule="threshold", threshold=0.7, early_stop=False, **settings)
    prompts = [whole.encode(p, chat=whole.has_chat_template) for p in PROMPTS]
    for batch in (prompts, prompts[1:2]):                  # left-padded rows, and one prompt alone
        expected, got = run(whole.decoder, batch, cfg), run(split.decoder, batch, cfg)
        assert got.ids == expected.ids, (family, cache)
        assert got.nfe == expected.nfe, (family, cache)
        distinct = len({t for row in got.ids for t in row})
        assert distinct > 3, (family, cache, got.ids)               # not one token repeated
        with capsys.disabled():
            print(f"\n[{family} {cache} rows={len(batch)}] tokens equal ({sum(map(len, got.ids))}, {distinct} "
                  f"distinct), NFE {got.nfe} = {expected.nfe}; layers on disk "
                  f"{len(layers_on(device_map, 'disk'))}/{LAYERS}", end="")


def test_offload_folder_goes_with_the_model(tmp_path):
    path = FAMILIES["llada"][0](tmp_path / "tiny-llada")
    lm = loading.load(path, dtype="fp64", device="cpu", max_memory=disk_budget(path))
    folder = next(hook.weights_map.dataset.save_folder for m in lm.model.modules()
                  if (hook := getattr(m, "_hf_hook", None)) is not None and getattr(hook, "weights_map", None) is not None)
    assert Path(folder).is_dir()
    del lm
    gc.collect()
    assert not Path(folder).exists()


@pytest.mark.parametrize("flags, message", [
    (dict(device="cuda:0", max_memory="0=1GB"), "--device cuda:0 puts the whole model on one device"),
    (dict(device="cpu", max_memory="0=1GB"), "only cpu and disk go with --device cpu"),
    (dict(device="auto", device_map="spread"), "--device-map spread: expected one of auto, balanced, sequential"),
    (dict(device="auto", max_memory="cpu=lots"), "--max-memory: size 'lots'"),
    (dict(device="auto", max_memory="disk=1GB"), "--max-memory: disk takes no size"),
    (dict(device="auto", max_memory="gpu=1GB"), "--max-memory: device 'gpu'"),
])
def test_flags_that_do_not_go_together(flags, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        split_of(flags["device"], flags.get("device_map"), flags.get("max_memory"))


def test_refusals_before_any_weight_is_read(tmp_path):
    path = FAMILIES["llada"][0](tmp_path / "tiny-llada")
    budget = disk_budget(path)
    with pytest.raises(UserError, match="fit on no device: add `disk` to --max-memory"):
        loading.load(path, dtype="fp64", device="cpu", max_memory=budget.replace(",disk", ""))
    with pytest.raises(UserError, match="--quantize int8 quantizes the weights it holds in memory, and this split leaves"):
        loading.load(path, dtype="fp32", device="cpu", quantize="int8", max_memory="cpu=100KB,disk")
