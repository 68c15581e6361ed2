"""Where the Hugging Face hub and its cache are, as the environment says now, and what a download
of a checkpoint fetches. Shared by locate.py, pull.py, gguf_repo.py and store.py."""

from __future__ import annotations

from pathlib import Path

# what a download fetches: weights, configs, tokenizer and chat-template files; never a .py file
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]


def hub_settings() -> dict:
    """The endpoint and cache as the environment says now: huggingface_hub reads HF_ENDPOINT and
    HF_HUB_CACHE once, at import; a command (and a test) may set them later."""
    import os

    settings = {}
    if os.environ.get("HF_ENDPOINT"):
        settings["endpoint"] = os.environ["HF_ENDPOINT"].rstrip("/")
    if os.environ.get("HF_HUB_CACHE"):
        settings["cache_dir"] = os.environ["HF_HUB_CACHE"]
    elif os.environ.get("HF_HOME"):
        settings["cache_dir"] = str(Path(os.environ["HF_HOME"]) / "hub")
    return settings
