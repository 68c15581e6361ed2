"""The canvas cache: right after a refresh, span forwards equal the full forward (fp64)."""

from __future__ import annotations

import pytest
import torch


def _canvas(lm, gen_len=32, committed=5):
    prompt = lm.encode("Tell me about caches.", chat=True)
    P = len(prompt)
    g = torch.Generator().manual_seed(0)
    answer = torch.full((gen_len,), lm.specials.mask)
    answer[:committed] = torch.randint(10, 300, (committed,), generator=g)   # some decoded tokens
    return torch.cat([torch.tensor(prompt), answer])[None], P


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_span_forwards_equal_full_forward_after_refresh(family, request, capsys):
    lm = request.getfixturevalue(f"{family}64")
    canvas, P = _canvas(lm)
    T = canvas.shape[1]
    s, e = P, P + 8                                   # the active block
    positions = torch.arange(s, e)[None]
    cache = lm.model.new_cache(torch.ones_like(canvas, dtype=torch.bool))
    with torch.no_grad():
        full = lm.model.forward_span(canvas, 0, T, cache, positions)          # refresh + logits
        prefix = lm.model.forward_span(canvas, s, T, cache, positions)
        dual = lm.model.forward_span(canvas, s, e, cache, positions)
        plain = lm.model(canvas).logits                                         # no cache at all
    shift = lm.model.logit_shift
    reference = plain[:, s - shift:e - shift]
    diffs = {"full vs plain": (full - reference).abs().max().item(),
             "prefix vs full": (prefix - full).abs().max().item(),
             "dual vs full": (dual - full).abs().max().item()}
    with capsys.disabled():
        print(f"\n[{family} fp64] max abs diff: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert full.dtype == torch.float64
    assert all(d < 1e-9 for d in diffs.values()), diffs


def test_cache_is_approximate_inside_a_block(llada64):
    """After committing tokens in the block, a dual step sees stale suffix keys: not equal any more
    to a full recompute (this is the paper's approximation, and why blocks refresh)."""
    canvas, P = _canvas(llada64)
    T = canvas.shape[1]
    s, e = P + 8, P + 16
    positions = torch.arange(s, e)[None]
    cache = llada64.model.new_cache(torch.ones_like(canvas, dtype=torch.bool))
    with torch.no_grad():
        llada64.model.forward_span(canvas, 0, T, cache, positions)
        canvas[0, s:s + 3] = torch.tensor([40, 41, 42])                         # commit in the block
        dual = llada64.model.forward_span(canvas, s, e, cache, positions)
        fresh = llada64.model(canvas).logits[:, s:e]
    assert (dual - fresh).abs().max().item() > 1e-6


def test_cache_bytes_and_no_cache_mode(llada64):
    valid = torch.ones(2, 50, dtype=torch.bool)
    cache = llada64.model.new_cache(valid)
    cfg = llada64.model.config
    expected = 2 * cfg.n_layers * 2 * cfg.n_kv_heads * 50 * (cfg.d_model // cfg.n_heads) * 8   # K+V, fp64
    assert cache.nbytes == expected
    assert llada64.model.new_cache(valid, keep_kv=False).nbytes == 0


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_inference_layout_keeps_numerics(family, request):
    """Fused q/k/v and gate/up plus oneDNN-packed CPU weights give the plain model's logits."""
    from fastdllm.checkpoints import loading
    from fastdllm.models import cpu

    path = request.getfixturevalue(f"{family}_dir")
    prepared = loading.load(path, dtype="fp32")
    plain = type(prepared.model).from_pretrained(path, dtype=torch.float32).eval()
    assert prepared.model.blocks[0].state_dict() != {} and any(
        p.is_mkldnn for p in prepared.model.parameters()) == (torch.float32 in cpu.packable_dtypes())
    canvas, P = _canvas(prepared)
    positions = torch.arange(P, P + 8)[None]
    with torch.no_grad():
        ours = prepared.model.forward_span(canvas, 0, canvas.shape[1], prepared.model.new_cache(
            torch.ones_like(canvas, dtype=torch.bool)), positions)
        reference = plain(canvas).logits[:, P - plain.logit_shift:P + 8 - plain.logit_shift]
    assert (ours - reference).abs().max().item() < 1e-4
    assert sum(p.numel() for p in prepared.model.parameters()) == sum(p.numel() for p in plain.parameters())
