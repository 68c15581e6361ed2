"""The engine's forward call, with CUDA graphs where a span repeats.

Inside a block every cached step recomputes the same canvas span [a, b) (prefix: block start to
canvas end; dual: the block; none: the whole canvas) against KV buffers at fixed addresses, so its
forward can be captured once and replayed: one launch instead of several hundred kernels. Without
it a DualCache step of an 8B model on an H200 is bound by Python and kernel launches, not by the GPU
(15.7 ms per step against a 3.1 ms weight-read bound; see scripts/speed.py).

A graph needs static shapes, so graph steps ask for logits at every position of the active block
(the engine fills the candidate list with committed positions, which are never selected). The
first forward of a span runs eagerly; when the next step repeats it, that step runs eagerly on a
side stream (lazy initialisation outside capture) and is captured; later repeats replay. One graph
lives at a time (a new span frees the old one and its memory pool); it dies with the generation.

Graphs are used on a single CUDA device with unquantized weights (bitsandbytes and accelerate's
offload hooks synchronise with the host). FASTDLLM_CUDA_GRAPHS=0 switches them off.
"""

from __future__ import annotations

import os
import warnings

import torch

from ..models.kv_cache import CanvasCache


class SpanForward:
    def __init__(self, model, canvas: torch.Tensor, cache: CanvasCache, *, graphs: bool, full_block: bool,
                 widen: bool = True):
        self.model, self.canvas, self.cache, self.widen = model, canvas, cache, widen
        self.graphs = graphs
        self.full_block = full_block or graphs   # static candidate count: every position of the block
        self.previous = None                     # (span, positions shape) of the last forward
        self.graph = self.graph_key = self.positions = self.logits = None
        self.captures = self.replays = 0

    @classmethod
    def for_model(cls, model, canvas: torch.Tensor, cache: CanvasCache, widen: bool = True) -> "SpanForward":
        return cls(model, canvas, cache, graphs=graphs_possible(model), full_block=False, widen=widen)

    def __call__(self, span: tuple[int, int], positions: torch.Tensor) -> torch.Tensor:
        """Logits (B, K, V) at canvas `positions` (B, K) after recomputing `span`."""
        if not self.graphs:
            return self._eager(span, positions)
        key = (span, tuple(positions.shape))
        if key == self.graph_key:
            self.positions.copy_(positions)
            self.graph.replay()
            self.replays += 1
            return self.logits
        repeated, self.previous = key == self.previous, key
        if not repeated:
            return self._eager(span, positions)
        return self._capture(key, positions)

    def _eager(self, span: tuple[int, int], positions: torch.Tensor) -> torch.Tensor:
        return self.model.forward_span(self.canvas, span[0], span[1], self.cache, positions, self.widen)

    def _capture(self, key, positions: torch.Tensor) -> torch.Tensor:
        self.graph = self.graph_key = self.logits = None       # free the previous graph and its pool
        self.positions = positions.clone()
        span = key[0]
        device = positions.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            logits = self._eager(span, self.positions)      # this step's result; it also writes the span's K/V
        torch.cuda.current_stream(device).wait_stream(side)
        logits.record_stream(torch.cuda.current_stream(device))   # used there from now on
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):   # its own memory pool, released with the graph
                self.logits = self._eager(span, self.positions)
        except RuntimeError as e:   # an op that cannot be captured: stay eager for this run
            warnings.warn(f"CUDA graph capture failed, continuing without graphs: {str(e).splitlines()[0]}")
            self.graphs, self.logits = False, None
            return logits
        self.graph, self.graph_key = graph, key
        self.captures += 1
        return logits


def graphs_possible(model) -> bool:
    """One CUDA device holds every weight (offloaded weights sit on 'meta'), none quantized, and the
    family's forward has static shapes (not MoE: the routing sizes each expert's matmul on the host)."""
    if os.environ.get("FASTDLLM_CUDA_GRAPHS", "1") == "0" or getattr(model, "is_quantized", False) \
            or not getattr(model, "cuda_graphs", True):
        return False
    devices = {p.device for p in model.parameters()}
    return len(devices) == 1 and next(iter(devices)).type == "cuda"
