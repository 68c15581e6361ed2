"""The non-weight files of published checkpoints (README.md here says which, and from where):
read by GGUF loading (Dream's config.json, gguf_arch.py) and by the tiny writers of fastdllm.testing."""

from pathlib import Path

FOLDER = Path(__file__).resolve().parent
