"""`fastdllm info [MODEL | -m MODEL]`: what a checkpoint is and how much memory it needs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from fastdllm import host_memory
from fastdllm.checkpoints.locate import resolve_model_dir
from fastdllm.errors import UsageError

from .options import ASSUME_GPUS, ASSUME_RAM
from .terminal import err_console, out_console, print_columns
from .user_errors import user_errors


@user_errors
def info(
    model: Annotated[Optional[str], typer.Argument(help="Checkpoint directory, catalog name or hub id (default: built-in model).")] = None,
    model_flag: Annotated[Optional[str], typer.Option("--model", "-m", help="The same, as every other command takes it.")] = None,
    gen_len: Annotated[int, typer.Option("--gen-len", "-n", help="Canvas tokens to generate, for the cache estimate.")] = 256,
    prompt_len: Annotated[int, typer.Option("--prompt-len", help="Prompt tokens, for the cache estimate.")] = 128,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    assume_gpus: Annotated[Optional[str], ASSUME_GPUS] = None,
    assume_ram: Annotated[Optional[str], ASSUME_RAM] = None,
):
    """Family, size, dtype on disk, context, special ids, chat template, memory estimates, and where
    it fits here (or on a described machine): whole, spread over GPUs, or split with the CPU and disk."""
    from fastdllm.checkpoints import fit
    from fastdllm.checkpoints.info import inspect_checkpoint, memory_estimate
    from fastdllm.checkpoints.cpu_dtype import auto_choice
    from fastdllm.models.cpu import bf16_note, this_cpu
    from fastdllm.units import human_bytes

    if model and model_flag and model != model_flag:
        raise UsageError(f"two models given: {model} and -m {model_flag}; pass one")
    details = inspect_checkpoint(resolve_model_dir(model_flag or model))
    memory = memory_estimate(details, prompt_len + gen_len)
    choice = auto_choice()
    machine = dict(this_cpu(), auto_dtype=choice.dtype, auto_dtype_reason=choice.reason,    # what --dtype auto loads here
                   malloc=host_memory.state)
    judged = fit.described(assume_gpus, assume_ram)
    key = "bf16" if judged.kind == "gpu" else choice.dtype                # what --dtype auto loads there
    placement = fit.verdict(Path(details["path"]).name, fit.with_float_widths(memory), key, judged,
                            details["packed_experts"], memory["bf16"]["cache"], details["layers"])
    if json_out:
        where = {"where": judged.label, "gpus_free_bytes": list(judged.gpus), "ram_free_bytes": judged.ram,
                 "dtype": key, "verdict": placement}
        out_console.print_json(json.dumps(dict(details, memory=memory, canvas_tokens=prompt_len + gen_len, cpu=machine,
                                               placement=where)))
        return
    rows = [("path", details["path"]), ("family", f"{details['family']} ({', '.join(details['architectures'])})"),
            *([("variant", details["variant"])] if details["variant"] else []),
            ("profile", f"{details['profile']} (when -P is not given)"),
            ("parameters", f"{details['parameters'] / 1e6:,.1f} M"
                           + (f" ({details['active_parameters'] / 1e6:,.1f} M active per token: mixture of experts)"
                              if details["active_parameters"] != details["parameters"] else "")),
            ("dtype on disk", f"{details['dtype_on_disk']} ({human_bytes(details['bytes_on_disk'])})"),
            ("layers / hidden", f"{details['layers']} / {details['hidden_size']}"),
            ("context length", f"{details['context_length']:,} tokens"),
            ("vocabulary", f"{details['vocab_size']:,}"),
            ("mask id", str(details["mask_id"]) if details["mask_id"] >= 0 else "none (the canvas starts as noise)"), ("eos ids", ", ".join(map(str, details["eos_ids"]))),
            ("end-of-turn id", str(details["end_of_turn_id"])),
            ("chat template", "yes" if details["chat_template"] else "no")]
    for name, est in memory.items():
        rows.append((f"memory {name}", f"{human_bytes(est['total'])} = weights {human_bytes(est['weights'])} "
                                       f"+ cache {human_bytes(est['cache'])} ({prompt_len}+{gen_len} tokens)"))
    rows.append(("placement", placement))
    rows.append(("this CPU", f"{machine['capability']}, {bf16_note()}"))
    rows.append(("--dtype auto on CPU", choice.reason))
    rows.append(("malloc", host_memory.state or "as it is (not started by the CLI)"))
    print_columns(rows)
    for warning in details["warnings"]:
        err_console.print(f"warning: {warning}", style="yellow")
