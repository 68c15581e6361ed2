"""The block-causal families' decoding as the tests read it, and their tiny float64 checkpoints
beside the transcriptions: shared by the exactness runner (tests/references/test_exactness.py)
and each family's own tests (tests/models/test_blockdiff.py, test_sdar_moe.py)."""

from __future__ import annotations

import reference_blockdiff as ref
from helpers import QWEN_IDS, prompt_of
from mask_heavy import heavy_copy, max_mask_probability
from reference_sdar_moe import NaiveSDARMoE

from fastdllm.checkpoints import loading
from fastdllm.decode.engine import generate
from fastdllm.decode.events import Result, StepEvent
from fastdllm.testing.tiny_sdar_moe import write_sdar_moe

# SDAR's strategies by fastdllm rule (the authors' generate's `remasking_strategy`)
SDAR_RULES = {"fixed": "low_confidence_static", "dynamic": "low_confidence_dynamic", "sequential": "sequential"}
HEAVY = "heavy_mask"
# SDAR-30B-A3B writer overrides by name: the published switches (every layer sparse, renormalised
# top-k), and the others: no renormalisation, dense layers by decoder_sparse_step (0, 2) and by mlp_only_layers (3)
SDAR_MOE = {"main": {}, "mixed": {"num_hidden_layers": 4, "decoder_sparse_step": 2, "mlp_only_layers": [3],
                                  "norm_topk_prob": False, "sharded": False}}


def block_steps(lm, prompts, cfg):
    """Per row: the denoising steps [(canvas position, token)] (steps that commit nothing left out),
    the store-pass commits (Fast-dLLM v2's first token of a block), the Result."""
    steps, stored, result = [[] for _ in prompts], [[] for _ in prompts], None
    for event in generate(lm.decoder, prompts, cfg):
        if isinstance(event, Result):
            result = event
            continue
        if not isinstance(event, StepEvent):
            continue
        for row, prompt in enumerate(prompts):
            pairs = sorted((int(p) + len(prompt), int(t)) for p, t, c in
                           zip(event.positions[row], event.tokens[row], event.committed[row]) if c)
            if event.step < 0:
                stored[row] += pairs
            elif pairs:
                steps[row].append(pairs)
    return steps, stored, result


def heavy(lm, naive_class, tmp_path_factory, canvas):
    """`lm` with a mask row that takes real probability on `canvas` (tests/mask_heavy.py), and its transcription."""
    made = heavy_copy(lm, tmp_path_factory.mktemp("heavy") / lm.path.name, canvas)
    assert max_mask_probability(made, canvas) > 0.05          # the fixture does not hide the normaliser
    return made, naive_class(made.path)


def sdar_moe_checkpoints(tmp_path_factory):
    """name (SDAR_MOE's or HEAVY) -> (float64 LoadedModel, NaiveSDARMoE), each written once."""
    made = {}

    def get(name):
        if name not in made and name == HEAVY:
            lm, _ = get("main")
            made[name] = heavy(lm, NaiveSDARMoE, tmp_path_factory, prompt_of(5, **QWEN_IDS) + [lm.specials.mask] * 16)
        if name not in made:
            path = write_sdar_moe(tmp_path_factory.mktemp("ckpt") / f"sdar-moe-{name}", **SDAR_MOE[name])
            made[name] = (loading.load(path, dtype="fp64"), NaiveSDARMoE(path))
        return made[name]
    return get


def sdar_trace(lm, naive, prompt, gen_len, block_len, per_block, rule, threshold):
    """The authors' SDAR generate (transcribed) on `prompt`, the mask token banned from the answer."""
    saved, ref.BANNED[:] = list(ref.BANNED), [lm.specials.mask]
    try:
        return ref.sdar_generate(naive, prompt, mask_id=lm.specials.mask, stop_ids=lm.specials.stops,
                                 gen_length=gen_len, block_length=block_len, denoising_steps=per_block,
                                 strategy=SDAR_RULES[rule], threshold=threshold)
    finally:
        ref.BANNED[:] = saved
