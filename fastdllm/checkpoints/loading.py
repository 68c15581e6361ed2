"""Load a checkpoint directory as published: config.json, sharded safetensors, tokenizer files.

Weights go through transformers' `from_pretrained` (dtype, accelerate `device_map`, bitsandbytes
`quantization_config`); our own classes are used for every family, so no Python file found in a
checkpoint directory is ever executed. Special ids come from the checkpoint, never from constants.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import host_memory, thread_watch
from ..decode.decoder import Decoder, SpecialTokens
from ..errors import UsageError, UserError
from .family import family_of, read_config
from .gguf_file import DEQUANTIZED, FOUR_BIT
from .gguf_file import state_dict as gguf_state_dict
from .gguf_folder import source_of
from .gguf_int4 import default_quantize, describe_kept, kernels_for
from .gguf_int8 import place_kept, state_dict_kept
from .packed_experts import load_experts_apart
from .placement import (
    BNB_ON_CPU_NOTE,
    CPU_FORMATS,
    placement_error,
    quantization_config,
    torch_placement,
)
from .specials import load_tokenizer, special_tokens
from .split import note, plan, refuse_split, split_of, summary
from .thinking import thought_markers, thought_prefill, without_thought


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    path: Path
    family: str
    specials: SpecialTokens
    context_length: int
    dtype: torch.dtype
    quantize: str
    load_seconds: float
    info: dict = field(default_factory=dict)
    thought: tuple[int, int] | None = None      # the template's thought-channel ids (thinking.py)
    notes: list[str] = field(default_factory=list)   # one line each, for the user (the CLI prints them)

    @property
    def device(self) -> torch.device:
        return self.model.input_device

    @property
    def decoder(self):
        """What the engine needs of this model."""
        return Decoder(self.model, self.specials, self.detokenize, self.context_length, self.path.name,
                       encode=lambda text: self.encode(text, chat=False))

    def detokenize(self, ids: list[int]) -> str:
        """The answer's text: special tokens and any thought span left out."""
        return self.tokenizer.decode(without_thought(ids, self.thought), skip_special_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode(self, prompt: str, *, chat: bool | None = None, system: str | None = None,
               history: list[dict] | None = None, thinking: bool | None = None) -> list[int]:
        """Token ids of `prompt`, wrapped in the chat template when `chat` (default: if there is one).
        `thinking`: the template's thinking switch (Gemma-4's `enable_thinking`); None: its default."""
        use_chat = self.has_chat_template if chat is None else chat
        if use_chat and not self.has_chat_template:
            raise UserError(f"{self.path.name} has no chat template; use --raw")
        if not use_chat:
            if thinking is not None:
                raise UserError("--think/--no-think switch the chat template's thinking: not with --raw")
            return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        messages = ([{"role": "system", "content": system}] if system else []) + list(history or [])
        messages.append({"role": "user", "content": prompt})
        return self.encode_messages(messages, thinking)

    def encode_messages(self, messages: list[dict], thinking: bool | None = None,
                        tools: list[dict] | None = None) -> list[int]:
        """Token ids of a conversation ({"role", "content"} dicts) in the chat template, ready for the
        assistant's answer; the template writes the special tokens, so the tokenizer adds none.
        `tools`: OpenAI tool dicts, rendered by the template (serve/tools.py)."""
        switch = ({} if thinking is None else {"enable_thinking": thinking}) | ({"tools": tools} if tools else {})
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **switch)
        if thinking and text == self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False):
            text += thought_prefill(self.thought, self.tokenizer)       # the switch alone changes nothing
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def load(path: str | Path, *, dtype: str = "auto", device: str = "auto", quantize: str = "none",
         device_map: str | None = None, max_memory: str | None = None, pack_weights: bool = True) -> LoadedModel:
    """`pack_weights=False` keeps plain weight layouts on CPU (the packed ones give identical
    results; tests compare the two). `device_map` / `max_memory`: a split over devices (split.py)."""
    start = time.perf_counter()
    for key, value in {"dtype": dtype, "device": device, "quantize": quantize}.items():
        if problem := placement_error(key, value):
            raise UsageError(problem)
    path = Path(path).expanduser()
    raw = read_config(path)
    config, model_cls, notes = family_of(raw, path)
    gguf = source_of(path)            # a GGUF file's folder (gguf_folder.py): weights from that file
    if gguf is None:
        _check_weights(path)
    else:                             # a Q4_0 / Q4_K file on a CPU: int4 unless asked otherwise (gguf_int4.py)
        quantize, kept_note = default_quantize(gguf, quantize, device, dtype)
    tokenizer = load_tokenizer(path)
    split = split_of(device, device_map, max_memory)
    torch_dtype, device_map, dtype_choice = torch_placement(dtype, device, quantize)
    cpu_quant = quantize in CPU_FORMATS
    if cpu_quant and model_cls.packed_experts:
        raise UserError(f"--quantize {quantize}: {path.name}'s experts are packed 3-D tensors, which the int8/int4 "
                        "CPU kernels do not take: use --quantize none, or 8bit/4bit")
    # our modules compute attention themselves: a config's attn_implementation (SDAR's published
    # configs name flex_attention) is not transformers' business here
    kwargs = {"dtype": torch_dtype, "device_map": device_map, "attn_implementation": "eager"}
    if split is not None:              # accelerate's plan, checked before any weight is read
        if gguf is not None:
            raise UserError("--device-map / --max-memory: a GGUF file loads whole on one device (--device)")
        kwargs["device_map"] = plan(model_cls, config, torch_dtype, split)
        refuse_split(kwargs["device_map"], quantize, CPU_FORMATS)
    if quantize in ("8bit", "4bit"):
        kwargs["quantization_config"] = quantization_config(quantize, torch_dtype,
                                                            skip=model_cls.quantize_skip)
        # experts packed in 3-D tensors (DiffusionGemma): per-expert linears, filled after the rest
        config.experts_apart = model_cls.packed_experts is not None
    from safetensors import SafetensorError

    kernel_for = kernels_for(quantize, gguf.get("types", ())) if gguf is not None else None
    kept = kernel_for is not None and any(t in DEQUANTIZED for t in gguf.get("types", ()))
    try:
        if kept:              # quantized tensors straight into int8 / int4 (gguf_int8.py): no bf16 copy of them
            kwargs["state_dict"], codes = state_dict_kept(Path(gguf["file"]), raw, torch_dtype, kernel_for)
        elif gguf is not None:
            kwargs["state_dict"] = gguf_state_dict(Path(gguf["file"]), raw, torch_dtype)
        if split is not None and "disk" in kwargs["device_map"].values():
            kwargs["offload_folder"] = tempfile.mkdtemp(prefix="fastdllm-offload-")
        model, report = model_cls.from_pretrained(None if gguf else path, config=config, output_loading_info=True,
                                                  **kwargs)
        if "offload_folder" in kwargs:          # the layers on disk read it as long as the model lives
            weakref.finalize(model, shutil.rmtree, kwargs["offload_folder"], ignore_errors=True)
        model_cls.check_loaded(report)
        parameters = None
        if kept:              # counted while the kept linears' stand-ins are still parameters
            parameters = sum(p.numel() for p in model.parameters())
            placed = place_kept(model, kwargs.pop("state_dict"), codes, torch_dtype)
        if config.experts_apart:
            load_experts_apart(model, path, kwargs["quantization_config"])
        model.read_files(path)                  # files beside the weights (Nemotron's linear_spec_lora)
        model.eval().prepare_for_inference(pack=pack_weights and not cpu_quant)
        if parameters is None:
            parameters = sum(p.numel() for p in model.parameters())
        if cpu_quant:
            quantized = cpu_quantize(model, quantize, torch_dtype, pack_weights, model_cls.quantize_skip)
        elif quantize != "none":
            model.is_quantized = True                   # decode/graphs.py: no CUDA graphs
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as e:
        if "offload_folder" in kwargs:
            shutil.rmtree(kwargs["offload_folder"], ignore_errors=True)
        raise UserError(f"cannot load weights from {path}: {str(e).splitlines()[0]}") from e
    specials = special_tokens(raw, tokenizer, path, model_cls)
    loaded = LoadedModel(model, tokenizer, path, raw["model_type"], specials, config.max_position_embeddings,
                         torch_dtype, quantize, time.perf_counter() - start, thought=thought_markers(tokenizer),
                         notes=notes)
    model.parameters_before_quantization = parameters
    loaded.info = describe(loaded)
    if dtype_choice:
        loaded.info["dtype_choice"] = dtype_choice        # what --dtype auto picked, and why
    if split is not None:
        loaded.info["device_map"] = summary(kwargs["device_map"])     # device -> how many parts
        loaded.notes += [line] if (line := note(kwargs["device_map"])) else []
    if gguf is not None:
        loaded.info.update(path=gguf["file"], gguf=gguf["dtype_on_disk"])
        if kept:
            loaded.info[f"gguf_{quantize}"] = describe_kept(placed, quantize)
            loaded.notes += [kept_note] if kept_note else []
        elif dequantized := [t for t in gguf.get("types", ()) if t in DEQUANTIZED]:
            keep = ("the int4 / int8 kernels are CPU kernels" if loaded.device.type != "cpu" else
                    "--quantize int4 keeps them quantized" if any(t in FOUR_BIT for t in dequantized) else
                    "--quantize int8 keeps them int8")
            loaded.notes.append(f"{', '.join(dequantized)} tensors dequantized to {loaded.info['dtype']} at load ({keep})")
    if loaded.device.type == "cpu":      # the CLI's thread count follows the free cores (thread_watch.py):
        model.embed.register_forward_pre_hook(thread_watch.poll)     # every forward path embeds first
    if cpu_quant:
        loaded.info["cpu_quantized"] = quantized
        if torch_dtype == torch.float32:
            loaded.notes.append(f"--quantize {quantize} with --dtype fp32: the kernels' fp32 path is a slow reference "
                                "loop, bf16 (the default) is their fast one")
    elif quantize != "none" and loaded.device.type == "cpu":
        loaded.notes.append(BNB_ON_CPU_NOTE)
    return loaded


def cpu_quantize(model, fmt: str, dtype: torch.dtype, pack: bool, skip: tuple[str, ...]) -> dict:
    """int8 / int4 in place of the float linears (models/cpu_quant.py), the input embedding as int8
    rows; what stays float (a router, shapes the int4 kernel cannot take) packed as usual."""
    from ..models.cpu import packable_dtypes
    from ..models.cpu_quant import quantize_model
    from ..models.layers import pack_linear

    done = quantize_model(model, fmt, dtype, embedding=True, skip=skip or ())
    dtypes = packable_dtypes() if pack else frozenset()
    for module in list(model.blocks.modules()) + [model.output_head]:
        if isinstance(module, torch.nn.Linear):
            pack_linear(module, dtypes)
    return done


def _check_weights(path: Path) -> None:
    if (path / "model.safetensors").is_file():
        return
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        raise UserError(f"{path} has no model.safetensors or model.safetensors.index.json")
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, AttributeError) as e:
        raise UserError(f"malformed {index}: {e}") from None
    missing = sorted(s for s in shards if not (path / s).is_file())
    if missing:
        raise UserError(f"{path} is missing weight shards: {', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else ""))


def describe(loaded: LoadedModel) -> dict:
    model = loaded.model
    params = model.parameters_before_quantization or sum(p.numel() for p in model.parameters())
    return {"path": str(loaded.path), "family": loaded.family, "attention": str(model.attention), "parameters": params,
            "dtype": str(loaded.dtype).replace("torch.", ""), "quantize": loaded.quantize,
            "device": str(loaded.device), "context_length": loaded.context_length,
            "mask_id": loaded.specials.mask, "stop_ids": list(loaded.specials.stops),
            "chat_template": loaded.has_chat_template,
            "weights_bytes": model.get_memory_footprint(), "load_seconds": round(loaded.load_seconds, 4),
            **cpu_details(loaded), **({"portable_4bit_layers": n} if (n := model.portable_4bit_layers) else {})}


def cpu_details(loaded: LoadedModel) -> dict:
    """On CPU: the ISA torch dispatches to, and for bf16 whether it runs natively or emulated."""
    from ..models import cpu

    if loaded.device.type != "cpu":
        return {}
    details = {"cpu_capability": cpu.capability(), "threads": torch.get_num_threads()}   # threads.py chose them
    if host_memory.state:                                       # the CLI's malloc setting (host_memory.py)
        details["malloc"] = host_memory.state
    if loaded.dtype == torch.bfloat16:
        details["bf16"] = "native" if cpu.bf16_native() else "emulated"
    return details
