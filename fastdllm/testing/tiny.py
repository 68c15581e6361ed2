"""Every tiny-checkpoint writer by family name (config.json's model_type where natural).

`WRITERS[family](out, **overrides)` writes a tiny random checkpoint of that family in its published
layout into the folder `out` and returns it; tests/conftest.py's session fixture `tiny` writes each
distinct (family, overrides) once per session through this table.
"""

from __future__ import annotations

from fastdllm.testing.tiny_blockdiff import write_fast_dllm_v2, write_sdar
from fastdllm.testing.tiny_gemma import write_diffusion_gemma
from fastdllm.testing.tiny_illada import write_illada
from fastdllm.testing.tiny_moe import write_llada2_2, write_llada2_moe, write_llada_moe
from fastdllm.testing.tiny_nemotron import write_nemotron
from fastdllm.testing.tiny_random import write_dream, write_llada
from fastdllm.testing.tiny_rnd1 import write_rnd1
from fastdllm.testing.tiny_sdar_moe import write_sdar_moe
from fastdllm.testing.tiny_steerling import write_steerling

WRITERS = {
    "llada": write_llada,
    "dream": write_dream,
    "sdar": write_sdar,
    "fast_dllm_v2": write_fast_dllm_v2,
    "llada2_moe": write_llada2_moe,
    "llada2_2": write_llada2_2,
    "llada_moe": write_llada_moe,
    "diffusion_gemma": write_diffusion_gemma,
    "nemotron": write_nemotron,
    "rnd1": write_rnd1,
    "sdar_moe": write_sdar_moe,
    "illada": write_illada,
    "steerling": write_steerling,
}
