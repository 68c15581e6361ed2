"""Train a small LLaDA-architecture model on Python source with the masked-diffusion objective.

Resumable: the full training state (weights, optimiser, step, RNG, wall time) is saved every few
minutes to `state_dir/state.pt`; the exported checkpoint (LLaDA format, bf16) and its
`trainer_state.json` are written next to it, so a run can also restart from the export alone.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..models import LLaDAConfig, LLaDAModelLM, cpu
from . import batches, certainty, data, mixture, tokenizer


@dataclass
class TrainConfig:
    out: Path                      # exported checkpoint directory (LLaDA format)
    state_dir: Path                # resumable training state
    corpus_root: Path | None = None  # default: this interpreter's stdlib
    recipe: str = "stdlib"           # "stdlib" (tiny-code: Python source), "tiny-llada" (mixture.py) or
                                     # "certainty" (certainty.py: the distillation stage on trajectories)
    init_from: str | None = None     # an exported checkpoint to start from (weights and tokenizer)
    entropy_weight: float = 2.0      # certainty: dParallel's settings
    entropy_temperature: float = 0.5
    block_share: float = 0.5         # tiny-llada: rows masked as block-wise decoding meets them
    loss_weight: str = "elbo"        # tiny-llada: "elbo" (1/t per masked token, LLaDA's loss) or "flat" (1 each:
                                     # scripts/copy_task.py: a d128 2-layer model copies 16 random tokens at 0.13 after 400 steps, 0.02 with 1/t)
    row_lengths: str = "0:0.85,256:0.1,512:0.05"   # tiny-llada: row length (0: tight):share of batches
    repeat_alphabets: str = mixture.REPEAT_ALPHABETS   # tiny-llada: repeat rows' alphabet size:share (mixture.py)
    mixture_weights: str = "mixture"  # tiny-llada: the rows' kinds, "kind:share,..." (a curriculum stage), or the recipe's WEIGHTS
    decay_minutes: float | None = None   # constant lr, then linear decay over a run's last minutes
    gen_len: int | None = None       # generation_config's default generation length (seq_len // 2)
    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 8
    n_heads: int = 8
    mlp_hidden_size: int = 768
    seq_len: int = 256
    max_sequence_length: int = 2048
    batch_size: int = 32
    lr: float = 1e-3
    min_lr_fraction: float = 0.1
    warmup_steps: int = 300
    total_steps: int = 20000
    weight_decay: float = 0.1
    sft_fraction: float = 0.5
    continuation_fraction: float = 0.0  # completions whose prompt also holds the first body lines
    seed: int = 0
    save_every_minutes: float = 10.0
    max_minutes: float | None = None   # stop (and save) after this much wall time in this run
    eval_every: int = 500
    threads: int | None = None
    device: str = "cpu"              # "cuda": bf16 autocast on the GPU (batches.py's workers feed it)
    workers: int = 0                 # processes generating rows (batches.py); 0: in this process, resumed exactly


SOURCES = {"stdlib": data.StdlibSource, "tiny-llada": mixture.MixtureSource, "certainty": certainty.CertaintySource}


def prepare(cfg: TrainConfig, log=print):
    """Tokenizer (trained once, then reused), the training rows' source, held-out rows."""
    if cfg.recipe not in SOURCES:                  # before the tokenizer is trained (a minute)
        raise SystemExit(f"--recipe {cfg.recipe}: expected one of {', '.join(SOURCES)}")
    train_files, held_files = data.corpus_files(cfg.corpus_root)
    texts = [data.read(p) for p in train_files]
    tok_dir = cfg.state_dir / "tokenizer"
    if cfg.init_from and not (tok_dir / "tokenizer.json").is_file():
        tok_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(cfg.init_from) / "tokenizer.json", tok_dir / "tokenizer.json")
    if (tok_dir / "tokenizer.json").is_file():
        tok = tokenizer.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    else:
        corpus = mixture.tokenizer_texts(random.Random(cfg.seed), texts) if cfg.recipe == "tiny-llada" else texts
        tok = tokenizer.train_bpe(corpus, cfg.vocab_size, split_digits=cfg.recipe == "tiny-llada")
        tokenizer.save_llada_tokenizer(tok, tok_dir)
    ids = {t: tok.token_to_id(t) for t in tokenizer.SPECIALS}
    source = SOURCES[cfg.recipe](cfg, tok, ids, texts)
    held_stream = []
    for enc in tok.encode_batch([data.read(p) for p in held_files]):
        held_stream.extend(enc.ids + [ids[tokenizer.EOS]])
    held = source.held_out(torch.tensor(held_stream))
    log(f"corpus: {len(train_files)} files; {source.describe()}; held out: {len(held_files)} modules")
    return tok, ids, source, held


def build_model(cfg: TrainConfig, ids: dict[str, int], vocab: int) -> LLaDAModelLM:
    config = LLaDAConfig(d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=cfg.n_heads, n_layers=cfg.n_layers,
                         mlp_hidden_size=cfg.mlp_hidden_size, vocab_size=vocab, embedding_size=vocab,
                         max_sequence_length=cfg.max_sequence_length, rope_theta=10000.0,
                         mask_token_id=ids[tokenizer.MASK], eos_token_id=ids[tokenizer.EOS],
                         pad_token_id=ids[tokenizer.EOS], bos_token_id=ids[tokenizer.BOS])
    torch.manual_seed(cfg.seed)
    return LLaDAModelLM(config)


def heldout_loss(model, held: tuple[torch.Tensor, torch.Tensor], mask_id: int) -> float:
    """Masked-diffusion loss on fixed held-out rows at fixed t (0.05 ... 1), fixed masks."""
    tokens, prompt = held
    gen = torch.Generator().manual_seed(1234)
    t = torch.linspace(0.05, 1.0, len(tokens))
    noisy, masked, t = data.mask_batch(tokens, prompt, mask_id, gen, t=t)
    device = data.device_of(model)
    model.eval()
    with torch.no_grad(), data.autocast(device):
        logits = model(noisy.to(device)).logits
    model.train()
    return float(data.weighted_loss(logits.cpu(), tokens, masked / t[:, None], prompt))


def lr_at(cfg: TrainConfig, step: int, run_first_step: int = 0, minutes_left: float | None = None) -> float:
    """Cosine (warm-up, then down to min_lr_fraction at total_steps), or with decay_minutes set:
    warm-up from this run's first step, constant, then linear decay over the run's last
    decay_minutes (each run of --max-minutes ends annealed; the next warms up again)."""
    if cfg.decay_minutes:
        warm = min(1.0, (step - run_first_step + 1) / cfg.warmup_steps)
        left = 1.0 if minutes_left is None else min(1.0, max(0.0, minutes_left / cfg.decay_minutes))
        return cfg.lr * warm * (cfg.min_lr_fraction + (1 - cfg.min_lr_fraction) * left)
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_fraction + (1 - cfg.min_lr_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(cfg: TrainConfig, resume: bool = False, log=print) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    tok, ids, source, held = prepare(cfg, log)
    model = build_model(cfg, ids, tok.get_vocab_size()).to(cfg.device)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    state = {"step": 0, "tokens": 0, "wall_seconds": 0.0, "runs": 0, "history": []}
    state_file = cfg.state_dir / "state.pt"
    if resume and state_file.is_file():
        saved = torch.load(state_file, weights_only=False, map_location=cfg.device)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        source.set_state(saved["generator"])
        state = saved["state"]
        log(f"resumed from {state_file} at step {state['step']}")
    elif (resume and (cfg.out / "trainer_state.json").is_file()) or cfg.init_from:   # weights only, from an export
        start = Path(cfg.init_from) if cfg.init_from and not resume else cfg.out
        exported = LLaDAModelLM.from_pretrained(start, dtype=torch.float32)
        model.load_state_dict(exported.state_dict())
        state = json.loads((start / "trainer_state.json").read_text())
        source.reseed(cfg.seed + state["step"])
        log(f"weights (optimiser reset) from {start} at step {state['step']}")
    state["runs"] += 1
    precision = ("bf16 autocast on " + torch.cuda.get_device_name(cfg.device) if cfg.device.startswith("cuda") else
                 "bf16 autocast" if cpu.bf16_native() else "fp32 (no bf16 kernels on this CPU)")
    state.setdefault("precisions", []).append(precision)
    log(f"precision: {precision}")
    state.setdefault("commands", []).append(" ".join(sys.argv[1:]) or "(train() called from Python)")

    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    run_start = last_save = time.perf_counter()
    first_step = state["step"]
    minutes_left = lambda: None if cfg.max_minutes is None else cfg.max_minutes - (time.perf_counter() - run_start) / 60
    wall_before = state["wall_seconds"]
    mask_id = ids[tokenizer.MASK]
    model.train()
    window_tokens, window_start = 0, time.perf_counter()
    rows = batches.stream(source, cfg.batch_size, cfg.workers, cfg.seed + first_step)
    while state["step"] < cfg.total_steps and not stop["now"]:
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, state["step"], first_step, minutes_left())
        tokens, prompt = next(rows)
        loss = source.loss(model, tokens, prompt, mask_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        state["tokens"] += tokens.numel()
        window_tokens += tokens.numel()
        now = time.perf_counter()
        state["wall_seconds"] = wall_before + (now - run_start)
        if state["step"] % 50 == 0:
            log(f"step {state['step']} loss {loss.item():.3f} lr {opt.param_groups[0]['lr']:.2e} "
                f"{window_tokens / (now - window_start):.0f} tok/s wall {state['wall_seconds'] / 60:.1f} min")
            window_tokens, window_start = 0, now
        if state["step"] % cfg.eval_every == 0:
            held_loss = heldout_loss(model, held, mask_id)
            state["history"].append({"step": state["step"], "train_loss": loss.item(), "heldout_loss": held_loss})
            log(f"step {state['step']} held-out loss {held_loss:.3f}")
        out_of_time = cfg.max_minutes is not None and now - run_start > cfg.max_minutes * 60
        if now - last_save > cfg.save_every_minutes * 60 or out_of_time:
            save(cfg, model, opt, source, state, tok, ids)
            last_save = now
        if out_of_time:
            break
    state["final_heldout_loss"] = heldout_loss(model, held, mask_id)
    state["final_train_loss"] = loss.item() if state["step"] else None
    save(cfg, model, opt, source, state, tok, ids)
    log(f"saved at step {state['step']}, held-out loss {state['final_heldout_loss']:.3f}")
    return state


def save(cfg: TrainConfig, model, opt, source, state, tok, ids) -> None:
    tmp = cfg.state_dir / "state.pt.tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "generator": source.get_state(),
                "state": state}, tmp)
    tmp.replace(cfg.state_dir / "state.pt")
    export(cfg, model, state, tok, ids)


def export(cfg: TrainConfig, model: LLaDAModelLM, state: dict, tok, ids: dict[str, int]) -> None:
    """The checkpoint in LLaDA's published layout, weights in bf16."""
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    bf16 = LLaDAModelLM(model.config)
    bf16.load_state_dict({name: t.cpu() for name, t in model.state_dict().items()})
    bf16.to(torch.bfloat16).save_pretrained(out, max_shard_size="15MB")   # shards of <16 MiB travel anywhere
    config = json.loads((out / "config.json").read_text())
    config.pop("dtype", None)
    config["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_llada_tokenizer(tok, out, tokenizer.LLADA_CHAT_TEMPLATE if cfg.recipe != "stdlib" else None)
    gen_config = {"bos_token_id": ids[tokenizer.BOS], "eos_token_id": ids[tokenizer.EOS],
                  "pad_token_id": ids[tokenizer.EOS], "mask_token_id": ids[tokenizer.MASK],
                  # fastdllm's model-defaults layer: the model was trained on rows of seq_len tokens
                  "fastdllm": {"gen_len": cfg.gen_len or cfg.seq_len // 2}}
    if cfg.recipe != "stdlib":                  # bench's default prompts: the graded tasks it was trained for
        gen_config["fastdllm_prompt_set"] = "tasks"
    (out / "generation_config.json").write_text(json.dumps(gen_config, indent=2) + "\n")
    record = {k: v for k, v in state.items()}
    record["train_config"] = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    (out / "trainer_state.json").write_text(json.dumps(record, indent=2) + "\n")
