"""`fastdllm list / show / rm / recommend / ps`: the models on this machine, in the catalog and in a
running server, as ollama users know these verbs (`pull`: pull_cmd.py). No torch except
`recommend` (it asks the GPUs for their free memory)."""

from __future__ import annotations

import json
import time
from typing import Annotated, Optional

import typer

from fastdllm.errors import UserError

from .options import ASSUME_GPUS, ASSUME_RAM
from .terminal import err_console, out_console, print_columns
from .user_errors import user_errors

PACKED_EXPERTS = {"diffusion_gemma"}   # experts in 3-D tensors: the CPU's int8/int4 kernels leave them (fit.choices)
MODELS_DIR = typer.Option("--models-dir", help="A folder of checkpoint folders, listed too (FASTDLLM_MODELS).")
JSON_OUT = typer.Option("--json", help="Print one JSON object.")


@user_errors
def list_(
    models_dir: Annotated[Optional[str], MODELS_DIR] = None,
    json_out: Annotated[bool, JSON_OUT] = False,
):
    """The models here: the built-in one, the Hugging Face cache, --models-dir."""
    from fastdllm.checkpoints.store import local_models
    from fastdllm.units import human_bytes

    models = local_models(models_dir)
    if json_out:
        out_console.print_json(json.dumps({"models": [
            {"name": m.name, "where": m.where, "path": str(m.path), "family": m.family, "size_bytes": m.size_bytes,
             "quantization": m.quantization, "last_used": m.last_used, "hub": m.hub} for m in models]}))
        return
    print_columns([(m.name, m.family, human_bytes(m.size_bytes), m.quantization, ago(m.last_used), m.where)
                   for m in models], header=("NAME", "FAMILY", "SIZE", "QUANTIZATION", "LAST USED", "WHERE"))


@user_errors
def show(
    name: Annotated[str, typer.Argument(help="Catalog name (dream:7b), hub id, or a local model's name.")],
    models_dir: Annotated[Optional[str], MODELS_DIR] = None,
    json_out: Annotated[bool, JSON_OUT] = False,
):
    """A model's card: family, profile, sizes, memory at bf16 / 8-bit / 4-bit, license, where it is."""
    from fastdllm.checkpoints import catalog
    from fastdllm.checkpoints.store import find_local
    from fastdllm.units import human_bytes

    entry = catalog.lookup(name)
    try:
        local = find_local(name, models_dir)
    except UserError:
        if entry is None:
            if catalog.is_short_name(name):
                catalog.find(name)                  # an unknown short name: the close ones, in one line
            raise UserError(f"'{name}' is neither in the catalog (`fastdllm recommend --all`) nor here "
                            f"(`fastdllm list`)") from None
        local = None
    if json_out:
        card = {"name": entry.name if entry else local.name}
        if entry:
            card.update(hub=entry.hub, revision=entry.revision, family=entry.family, profile=entry.profile,
                        license=entry.license, about=entry.about, **entry.sizes,
                        **({"gguf": entry.gguf, "note": entry.note} if entry.gguf else {}))
        if local:
            card.update(path=str(local.path), size_bytes=local.size_bytes, quantization=local.quantization,
                        family=local.family)
        out_console.print_json(json.dumps(card))
        return
    rows = []
    if entry:
        rows += [("name", entry.name), ("about", entry.about), ("hub", entry.hub + (f"@{entry.revision}" if entry.revision else "")),
                 ("family", entry.family), ("profile", entry.profile), ("parameters", entry.size_label()),
                 ("context", f"{entry.context:,} tokens" if entry.context else "unknown")]
        for p in catalog.PRECISIONS:
            gib = entry.memory_gib(p)
            where = "; GPU only: the CPU's int8/int4 leave packed experts" \
                if p != "bf16" and entry.family in PACKED_EXPERTS else "; a GPU dequantizes the file" if entry.gguf else ""
            rows.append((f"memory {p}", f"{gib:.1f} GiB ({catalog.CANVAS_TOKENS}-token canvas{where})" if gib else "unknown"))
        for tag, _, held in entry.gguf_forms("cpu") if entry.gguf else []:       # each quant tag's file
            fields = entry.gguf[tag]
            named = f", {fields['file']}" if fields.get("file") else ""
            rows.append((f"gguf {tag}", f"{fields['bytes']:,} bytes ({human_bytes(fields['bytes'])}, {fields['source']}{named}); "
                                        f"{held:.1f} GiB held on a CPU"))
        if entry.note:
            rows.append(("note", entry.note))
        rows.append(("license", entry.license))
    else:
        rows += [("name", local.name), ("family", local.family)]
    if local:
        rows += [("local", f"{local.path} ({human_bytes(local.size_bytes)}, {local.quantization})")]
    else:
        tag = f":{next(iter(entry.gguf))}" if entry.gguf else ""
        rows += [("local", f"not here: fastdllm pull {entry.name}{tag}")]
    print_columns(rows)


@user_errors
def rm(
    name: Annotated[str, typer.Argument(help="A local model: catalog name, hub id or folder name (fastdllm list).")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    models_dir: Annotated[Optional[str], MODELS_DIR] = None,
):
    """Remove a downloaded model (only its own files)."""
    from fastdllm.checkpoints.store import find_local, remove
    from fastdllm.units import human_bytes

    model = find_local(name, models_dir)
    if model.remove_root is None:
        remove(model)                                            # raises: the built-in model stays
    if not yes and not typer.confirm(f"remove {model.name} ({human_bytes(model.size_bytes)}, {model.remove_root})?",
                                     default=False, err=True):
        err_console.print("not removed")
        raise typer.Exit(1)
    freed = remove(model)
    err_console.print(f"removed {model.name} ({human_bytes(freed)} freed)")


@user_errors
def recommend(
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N: where it would run.")] = "auto",
    all_: Annotated[bool, typer.Option("--all", help="Also the entries that do not fit.")] = False,
    json_out: Annotated[bool, JSON_OUT] = False,
    assume_gpus: Annotated[Optional[str], ASSUME_GPUS] = None,
    assume_ram: Annotated[Optional[str], ASSUME_RAM] = None,
):
    """The catalog entries that fit this machine (or a described one), each in the best form that
    fits whole, else split over its GPUs, CPU and disk, with its settings."""
    from fastdllm.checkpoints import catalog, fit

    machine = fit.described(assume_gpus, assume_ram, device)
    rows, found, packed, splits = [], [], [], []
    for entry in catalog.entries().values():
        fits, (label, flags, gib) = verdict(entry, machine)
        split = None
        if fits is False and not entry.gguf and (split := split_of(entry, machine, "bf16")):    # bf16, split
            fits, (label, flags, gib) = True, ("bf16", split.flags, entry.memory_gib("bf16"))
        elif fits and len(machine.gpus) > 1:                                # held by several GPUs together?
            split = split_of(entry, machine, label, ram=False)
        if split:
            splits.append(f"{entry.name}: {split.line()}")
        if not fits and not all_:
            continue
        found.append({"name": entry.name, "fits": fits, "form": label, "flags": flags, "memory_gib": gib,
                      "profile": entry.profile, "parameters": entry.parameters,
                      **({"split": split.line()} if split else {})})
        if machine.kind == "cpu" and entry.family in PACKED_EXPERTS:
            packed.append(entry.name)
        run_with = flags if fits else "does not fit" if fits is False else "size unknown"
        memory = f"{gib:.1f} GiB" + ("" if fits else f" at {label}") if gib else "unknown"
        rows.append((entry.name, entry.size_label(), run_with, memory, f"-P {entry.profile}"))
    if json_out:
        out_console.print_json(json.dumps({"free_bytes": machine.free_bytes, "where": machine.label, "models": found}))
        return
    err_console.print(f"{machine.label}: {fit.gib(machine.free_bytes)} free (1 GiB kept for running)")
    if not rows:
        raise UserError(f"no catalog model fits in {fit.gib(machine.free_bytes)}; `fastdllm recommend --all` lists their needs")
    print_columns(rows, header=("NAME", "PARAMETERS", "RUN WITH", "MEMORY", "PROFILE"))
    for line in splits:
        err_console.print(f"split: {line}")
    if packed:
        err_console.print(f"note: {', '.join(packed)}: bf16 only on a CPU (the int8/int4 kernels do not quantize "
                          f"packed experts); the 8bit/4bit sizes of `fastdllm show` are for a GPU")
    if all_ and any(f["fits"] is None for f in found):
        err_console.print("note: size unknown: the entry's config.json was not seen when the catalog was written; "
                          "`fastdllm pull NAME` then `fastdllm info NAME` measures it")


@user_errors
def ps(
    host: Annotated[str, typer.Option("--host", help="Where `fastdllm serve` listens.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Its port.")] = 8000,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="FASTDLLM_API_KEY", help="Its API key, if it has one.")] = None,
    json_out: Annotated[bool, JSON_OUT] = False,
):
    """What a running `fastdllm serve` has loaded (its /api/ps)."""
    import urllib.error
    import urllib.request

    from fastdllm.units import human_bytes

    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/api/ps"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            loaded = json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise UserError(f"{url} answered {e.code}" + (": pass --api-key" if e.code == 401 else "")) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise UserError(f"no fastdllm serve at {url} ({reason}); start one with `fastdllm serve`") from None
    if json_out:
        out_console.print_json(json.dumps(loaded))
        return
    print_columns([(m["name"], m["details"]["family"], human_bytes(m["size"]), m["details"]["quantization_level"].lower(),
                    "GPU" if m.get("size_vram") else "CPU", f"{m.get('context_length', 0):,}")
                   for m in loaded["models"]], header=("NAME", "FAMILY", "SIZE", "PRECISION", "PROCESSOR", "CONTEXT"))


def verdict(entry, machine) -> tuple[bool | None, tuple[str | None, str | None, float | None]]:
    """(fits?, (form, flags, GiB)): the best-quality form that fits; else (False, the smallest form
    it would need here); (None, nothing) when the catalog does not know its size."""
    from fastdllm.checkpoints import fit

    # the catalog holds bf16 / 8bit / 4bit; the CPU kernels' int8 / int4 take about what 8bit / 4bit take
    forms = ([("bf16", "bf16", "--dtype bf16"), ("8bit", "8bit", "--quantize 8bit"), ("4bit", "4bit", "--quantize 4bit")]
             if machine.kind == "gpu" else
             [("bf16", "bf16", "--dtype bf16")] + ([] if entry.family in PACKED_EXPERTS else
                                                    [("8bit", "int8", "--quantize int8"), ("4bit", "int4", "--quantize int4")]))
    known = [(label, flags, entry.memory_gib(key)) for key, label, flags in forms if entry.memory_gib(key)]
    if entry.gguf:                          # a repository of GGUF files: its quant tags, by their sizes
        known = [form for form in entry.gguf_forms(machine.kind) if form[2]]
    for label, flags, gib in known:
        if machine.fits(int(gib * fit.GIB)):
            return True, (label, flags, gib)
    return (False, (known[-1][0], None, known[-1][2])) if known else (None, (None, None, None))


def split_of(entry, machine, form: str, ram: bool = True):
    """The split (fit_split.Proposal) that holds the entry in `form` (bf16, 8bit, 4bit) here, or None
    (one device holds it, its size is unknown, or no split holds it). The catalog's memory holds a
    384-token cache; its layers are not known: 32 parts of equal size stand for them."""
    from fastdllm.checkpoints import fit

    if form not in ("bf16", "8bit", "4bit") or not entry.memory_gib(form):
        return None
    return fit.split_for({form: int(entry.memory_gib(form) * fit.GIB)}, form, machine, 0, 32, ram=ram)


def ago(seconds_since_epoch: float) -> str:
    """'3 minutes ago', '2 days ago'."""
    delta = max(0, time.time() - seconds_since_epoch)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if delta >= size:
            n = int(delta // size)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"
