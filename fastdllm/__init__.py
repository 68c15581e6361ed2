"""fastdllm: fast local decoding for diffusion language models (README.md, docs/architecture.md)."""

from pathlib import Path as _Path

from .source_tree import map_checkout as _map_checkout

_map_checkout(_Path(__file__).resolve().parent)
