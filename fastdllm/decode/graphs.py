"""The engine's forward call, with CUDA graphs where a span repeats.

Inside a block every cached step recomputes the same canvas span [a, b) (prefix: block start to
canvas end; dual: the block; none: the whole canvas) against KV buffers at fixed addresses, so its
forward can be captured once and replayed: one launch instead of several hundred kernels. Without
it a DualCache step of an 8B model on an H200 is bound by Python and kernel launches, not by the GPU
(15.7 ms per step against a 3.1 ms weight-read bound; see benchmarks/speed.py).

A graph needs static shapes, so graph steps ask for logits at every position of the active block.
Where the step's decision runs on the device too (device_step.py: greedy mask-predict decoding of
a bidirectional family) the graph holds the whole step, forward + predict + select + commit;
otherwise it holds the forward, and the engine fills the candidate list with committed positions,
which are never selected. The first run of a key (the span, and for a whole step its block) is
eager; when the next step repeats it, that step runs eagerly on a side stream (lazy initialisation
outside capture) and is captured, the capture itself executing nothing; later repeats replay. One
graph lives at a time (a new key frees the old one and its memory pool); it dies with the generation.

Graphs are used on a single CUDA device with unquantized weights (bitsandbytes and accelerate's
offload hooks synchronise with the host). FASTDLLM_CUDA_GRAPHS=0 switches them off.
"""

from __future__ import annotations

import os
import warnings

import torch

from ..models.kv_cache import CanvasCache
from .batch_invariant import forward_by_row


class SpanForward:
    def __init__(self, model, canvas: torch.Tensor, cache: CanvasCache, *, graphs: bool, full_block: bool,
                 widen: bool = True, device_step: bool | None = None):
        self.model, self.canvas, self.cache, self.widen = model, canvas, cache, widen
        self.graphs = graphs
        self.full_block = full_block or graphs   # static candidate count: every position of the block
        self.device_step = graphs if device_step is None else device_step   # the engine may use DeviceStep
        self.previous = None                     # the key of the last run
        self.row_extents = None                  # batch_invariant.py: each row's slots, forwards row by row
        self.graph = self.graph_key = self.inputs = self.outputs = None
        self.captures = self.replays = 0

    @classmethod
    def for_model(cls, model, canvas: torch.Tensor, cache: CanvasCache, widen: bool = True) -> "SpanForward":
        return cls(model, canvas, cache, graphs=graphs_possible(model), full_block=False, widen=widen)

    def __call__(self, span: tuple[int, int], positions: torch.Tensor) -> torch.Tensor:
        """Logits (B, K, V) at canvas `positions` (B, K) after recomputing `span`."""
        return self.graphed((span, tuple(positions.shape)), lambda p: self.eager(span, p), positions)

    def eager(self, span: tuple[int, int], positions: torch.Tensor) -> torch.Tensor:
        if self.row_extents is not None:
            return forward_by_row(self.model, self.canvas, self.cache, self.row_extents, span, positions, self.widen)
        return self.model.forward_span(self.canvas, span[0], span[1], self.cache, positions, self.widen)

    def graphed(self, key, fn, *inputs: torch.Tensor) -> torch.Tensor:
        """fn(*inputs) -> one tensor, replayed from a graph where `key` repeats. fn reads only
        `inputs` (copied into the graph's own before a replay) and tensors at fixed addresses (the
        canvas, the cache, the caller's buffers); it must not read anything on the host."""
        if not self.graphs:
            return fn(*inputs)
        if key == self.graph_key:
            for static, given in zip(self.inputs, inputs):
                static.copy_(given)
            self.graph.replay()
            self.replays += 1
            return self.outputs
        repeated, self.previous = key == self.previous, key
        if not repeated:
            return fn(*inputs)
        return self._capture(key, fn, inputs)

    def _capture(self, key, fn, inputs) -> torch.Tensor:
        self.graph = self.graph_key = self.outputs = None      # free the previous graph and its pool
        self.inputs = [t.clone() for t in inputs]
        device = self.canvas.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            out = fn(*self.inputs)          # this step's result (it writes the span's K/V, a step its commit)
        torch.cuda.current_stream(device).wait_stream(side)
        out.record_stream(torch.cuda.current_stream(device))   # used there from now on
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):   # its own memory pool, released with the graph; records, runs nothing
                self.outputs = fn(*self.inputs)
        except RuntimeError as e:   # an op that cannot be captured: stay eager for this run
            warnings.warn(f"CUDA graph capture failed, continuing without graphs: {str(e).splitlines()[0]}")
            self.graphs, self.outputs = False, None
            return out
        self.graph, self.graph_key = graph, key
        self.captures += 1
        return out


def graphs_possible(model) -> bool:
    """One CUDA device holds every weight (offloaded weights sit on 'meta'), none quantized, and the
    family's forward has static shapes (not MoE: the routing sizes each expert's matmul on the host)."""
    if os.environ.get("FASTDLLM_CUDA_GRAPHS", "1") == "0" or model.is_quantized \
            or not model.cuda_graphs:
        return False
    devices = {p.device for p in model.parameters()}
    return len(devices) == 1 and next(iter(devices)).type == "cuda"
