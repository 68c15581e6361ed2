"""Steerling against its authors' own `SteerlingGenerator.generate_full` (the `steerling` package,
0.2.0; skipped where it is not installed: it needs Python >= 3.13 by its metadata and pins old
torch/transformers, so it is not a test dependency; `pip install --no-deps --ignore-requires-python
steerling==0.2.0 tiktoken` runs it here). Their InterpretableCausalDiffusionLM is built from the tiny
checkpoint's config, loaded with its tensors (concept heads included), cast to float64 and wrapped
with a stub tokenizer; tokens, output ids and forward counts must equal fastdllm's."""

from __future__ import annotations

import json

import pytest
import torch

steerling = pytest.importorskip("steerling.inference.causal_diffusion")

from safetensors.torch import load_file  # noqa: E402
from steerling.configs.causal_diffusion import CausalDiffusionConfig  # noqa: E402
from steerling.configs.concept import ConceptConfig  # noqa: E402
from steerling.configs.generation import GenerationConfig  # noqa: E402
from steerling.models.interpretable.interpretable_causal_diffusion import InterpretableCausalDiffusionLM  # noqa: E402

from fastdllm.testing.tiny_steerling import ENDOFCHUNK, EOT, write_steerling  # noqa: E402
from steerling_trace import ENTROPY, GREEDY, PROMPTS, TOP_P, ours, steered_row  # noqa: E402


class StubTokenizer:
    def __init__(self, c: dict):
        self.mask_token_id, self.eos_token_id, self.pad_token_id = c["mask_token_id"], c["eos_token_id"], c["pad_token_id"]
        self.eot_id = c.get("eot_id")

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def their_generator(folder):
    c = json.loads((folder / "config.json").read_text())
    arch = CausalDiffusionConfig.model_validate({k: v for k, v in c.items() if k in CausalDiffusionConfig.model_fields
                                                 and k != "model_type"})
    concept = ConceptConfig.model_validate({**{k: v for k, v in c.items() if k in ConceptConfig.model_fields},
                                            "block_size": c["concept_block_size"]})
    model = InterpretableCausalDiffusionLM(arch, concept, c["vocab_size"])
    weights = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    model.load_state_dict(weights, strict=False)
    model.transformer._restore_weight_tying()
    model = model.double()
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    return steerling.SteerlingGenerator(model, StubTokenizer(c), arch, is_interpretable=True, device="cpu"), calls


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("steerling_package")
    instruct = write_steerling(root / "instruct", dtype=torch.float64, instruct=True, seed=3)
    return {"base": write_steerling(root / "base", dtype=torch.float64, seed=5),
            "grid64": write_steerling(root / "grid64", dtype=torch.float64, seed=1, diff_block_size=64, clip_qkv=None,
                                      weight_sharing=False, sharded=True),
            "instruct": write_steerling(root / "instruct", dtype=torch.float64, instruct=True, seed=3,
                                        eot_row=steered_row(instruct, EOT, 1.2))}


@pytest.mark.parametrize("name, L, gen, steps, sampling, rp, stops", [
    ("base", 9, 24, None, GREEDY, 1.1, None), ("base", 3, 16, 4, ENTROPY, 1.1, [ENDOFCHUNK]),
    ("base", 15, 24, 12, TOP_P, 1.0, None), ("grid64", 9, 64, 16, ENTROPY, 1.1, None),
    ("instruct", 15, 32, 16, ENTROPY, 1.1, [EOT]), ("instruct", 9, 16, None, GREEDY, 1.1, [EOT])])
def test_generate_full_itself(folders, name, L, gen, steps, sampling, rp, stops):
    generator, calls = their_generator(folders[name])
    config = GenerationConfig(max_new_tokens=gen, steps=steps, temperature=sampling["temperature"],
                              top_p=sampling.get("top_p", 0.8), repetition_penalty=rp,
                              use_entropy_sampling=sampling["entropy_sampling"], seed=11, stop_tokens=stops)
    theirs = generator.generate_full(torch.tensor([PROMPTS[L]]), config)
    got, _ = ours(folders[name], [PROMPTS[L]], gen_len=gen, steps=steps, repetition_penalty=rp, seed=11,
                  early_stop=bool(stops), **sampling)
    assert got.canvas[0].tolist() == theirs.tokens[L:].tolist()
    assert got.ids[0] == ([int(t) for t in theirs.text.split()] if theirs.text else [])
    assert got.nfe == len(calls)
