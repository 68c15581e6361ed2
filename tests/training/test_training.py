"""The training script's pieces on a toy corpus: a few optimisation steps, export in LLaDA's layout,
resume. (Training itself is not run in CI.)"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch

from fastdllm.checkpoints import loading
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run
from fastdllm.training import data
from fastdllm.training.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[2]


def toy_corpus(root: Path) -> Path:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    root.mkdir()
    for name in ("bisect.py", "colorsys.py", "keyword.py", "this.py", "glob.py"):   # bisect, colorsys: held out
        shutil.copyfile(stdlib / name, root / name)
    return root


def tiny_config(tmp_path: Path, corpus: Path, **overrides) -> TrainConfig:
    values = dict(out=tmp_path / "out", state_dir=tmp_path / "state", corpus_root=corpus, vocab_size=300,
                  d_model=32, n_layers=2, n_heads=2, mlp_hidden_size=64, seq_len=32, max_sequence_length=256,
                  batch_size=4, total_steps=3, warmup_steps=1, eval_every=2, save_every_minutes=60)
    values.update(overrides)
    return TrainConfig(**values)


def test_corpus_split_and_functions():
    train_files, held = data.corpus_files()
    assert {p.stem for p in held} == set(data.HELD_OUT)
    assert not any(p in train_files for p in held)
    assert not any("test" in p.relative_to(Path(sysconfig.get_paths()["stdlib"])).parts[:-1] for p in train_files)
    header, body = data.functions("class A:\n    def f(self, x):\n        '''Doc.'''\n        return x\n")[0]
    assert header == "def f(self, x):\n" and body.startswith("    '''Doc.'''")


def test_masking_and_loss():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(5, 50, (2, 16))
    prompt = torch.tensor([4, 0])
    noisy, masked, t = data.mask_batch(tokens, prompt, mask_id=2, gen=gen, t=torch.tensor([1.0, 1.0]))
    assert not masked[0, :4].any() and masked[0, 4:].all() and masked[1].all()   # prompt never masked
    assert (noisy[masked] == 2).all()
    logits = torch.zeros(2, 16, 50)
    loss = data.weighted_loss(logits, tokens, masked / t[:, None], prompt)
    assert torch.isclose(loss, torch.log(torch.tensor(50.0)))                   # uniform logits: log V


def test_the_head_at_masked_positions_only_gives_the_full_forward_loss():
    from fastdllm.models import LLaDAConfig, LLaDAModelLM

    torch.manual_seed(0)
    config = LLaDAConfig(d_model=32, n_heads=2, n_kv_heads=2, n_layers=2, mlp_hidden_size=64, vocab_size=60,
                         embedding_size=60, max_sequence_length=64, rope_theta=10000.0, mask_token_id=2,
                         eos_token_id=1, pad_token_id=1, bos_token_id=0)
    model = LLaDAModelLM(config).double()
    tokens, prompt = torch.randint(5, 60, (3, 20)), torch.tensor([6, 0, 11])
    noisy, masked, t = data.mask_batch(tokens, prompt, mask_id=2, gen=torch.Generator().manual_seed(1),
                                       t=torch.tensor([0.5, 0.3, 0.9]))
    weight = (masked / t[:, None]).double()
    assert 0 < int(masked.sum()) < masked.numel() // 2             # some positions are left out of the head
    full = data.weighted_loss(model(noisy).logits, tokens, weight, prompt)
    assert full.dtype == torch.float64
    assert abs(float(data.forward_loss(model, noisy, tokens, weight, prompt) - full)) < 1e-12 * float(full)


def test_a_few_steps_export_and_resume(tmp_path):
    corpus = toy_corpus(tmp_path / "corpus")
    state = train(tiny_config(tmp_path, corpus), log=lambda _: None)
    assert state["step"] == 3 and torch.isfinite(torch.tensor(state["final_heldout_loss"]))
    out = tmp_path / "out"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "generation_config.json", "trainer_state.json"):
        assert (out / name).is_file(), name
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llada" and config["architectures"] == ["LLaDAModelLM"]
    lm = loading.load(out)                                      # the normal LLaDA loading path
    assert lm.specials.mask == config["mask_token_id"]
    result = run(lm.decoder, [lm.encode("def f(x):", chat=False)], DecodeConfig(gen_len=16, block_len=8))
    assert result.nfe >= 1
    resumed = train(tiny_config(tmp_path, corpus, total_steps=5), resume=True, log=lambda _: None)
    assert resumed["step"] == 5 and resumed["runs"] == 2


def test_worker_processes_draw_their_own_seeded_rows_and_train(tmp_path):
    from fastdllm.training import batches
    from fastdllm.training.train import prepare

    corpus = toy_corpus(tmp_path / "corpus")
    cfg = tiny_config(tmp_path, corpus, workers=2)
    _, _, source, _ = prepare(cfg, log=lambda _: None)
    rows = batches.stream(source, 4, workers=2, seed=7)
    first, second = next(rows)[0], next(rows)[0]                 # one from each worker, in turn
    source.reseed(7 * 1000 + 1)
    assert torch.equal(second, source.batch(4)[0]) and not torch.equal(first, second)
    state = train(cfg, log=lambda _: None)
    assert state["step"] == 3 and torch.isfinite(torch.tensor(state["final_heldout_loss"]))


def test_script_runs_a_few_steps(tmp_path):
    corpus = toy_corpus(tmp_path / "corpus")
    cmd = [sys.executable, str(ROOT / "scripts" / "train_tiny.py"), "--out", str(tmp_path / "o"),
           "--state-dir", str(tmp_path / "s"), "--corpus-root", str(corpus), "--vocab-size", "300",
           "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--mlp-hidden-size", "64",
           "--seq-len", "32", "--batch-size", "2", "--total-steps", "2", "--warmup-steps", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "saved at step 2" in done.stdout


def test_continuations_move_first_body_lines_into_the_prompt():
    header, body = "def f(x):\n", "    y = x\n    z = y\n    return z\n"
    ks = set()
    for seed in range(20):
        prompt, answer = data.continuation(header, body, random.Random(seed))
        assert prompt + answer == header + body and prompt.startswith(header)
        ks.add(prompt.count("\n") - 1)
    assert ks == {1, 2}                                   # 1..min(3, lines - 1) body lines moved
    assert data.continuation(header, "    return x\n", random.Random(0)) is None
    plain, continued = ([1, 2], [3, 4, 5]), ([1, 2, 3], [4, 5])
    for fraction, prompt_len in ((0.0, 2), (1.0, 3)):
        ex = data.Examples(torch.arange(100), [plain], 8, eos=0, sft_fraction=1.0,
                           continuations=[continued], continuation_fraction=fraction)
        tokens, prompts = ex.batch(4, torch.Generator().manual_seed(0))
        assert prompts.tolist() == [prompt_len] * 4
        assert tokens[0].tolist() == [1, 2, 3, 4, 5, 0, 0, 0]
