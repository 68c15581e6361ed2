"""batch_invariant: a row decoded in a batch computes exactly what it computes alone, in bf16 and
fp32 (bitwise: the confidence each token was committed at, not only the tokens)."""

import pytest

from fastdllm.checkpoints import loading
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import generate
from fastdllm.decode.events import Result, StepEvent
from fastdllm.errors import UserError

pytestmark = pytest.mark.fast

PROMPTS = ["def add(a, b):", "Write a function that reverses a list of numbers and returns it.",
           "x = 1", "Question: Mia has 12 apples and buys 7 more. How many does she have?\nAnswer:"]


def commits(lm, prompts, cfg, gen_lens=None):
    """Per row: the answer's ids and {generated position: the confidence it was committed at}."""
    rows = [lm.encode(p, chat=False) for p in prompts]
    at = [dict() for _ in rows]
    for event in generate(lm.decoder, rows, cfg, gen_lens=gen_lens):
        if isinstance(event, StepEvent):
            for b in range(len(rows)):
                for p, c, done in zip(event.positions[b].tolist(), event.confidences[b].tolist(), event.committed[b].tolist()):
                    if done:
                        at[b][p] = c
        elif isinstance(event, Result):
            return [(ids, conf) for ids, conf in zip(event.ids, at)]


@pytest.fixture(scope="module", params=["bf16", "fp32"])
def models(request, llada_dir, dream_dir):
    return [loading.load(d, dtype=request.param) for d in (llada_dir, dream_dir)]


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_each_row_in_a_batch_commits_what_it_commits_alone(models, cache):
    for lm in models:
        cfg = DecodeConfig(gen_len=64, block_len=16, cache=cache, rule="threshold", threshold=0.7,
                           batch_invariant=True)
        lens = [64, 32, 64, 48]                      # rows of other lengths too, as serve batches them
        batched = commits(lm, PROMPTS, cfg, gen_lens=lens)
        for b, prompt in enumerate(PROMPTS):
            alone = commits(lm, [prompt], cfg, gen_lens=[lens[b]])[0]
            assert batched[b] == alone, (lm.path.name, cache, b)


def test_what_it_does_not_cover_is_one_line(llada_dir):
    lm = loading.load(llada_dir, dtype="fp32")
    rows = [lm.encode("x = 1", chat=False)] * 2
    for extra in ({"cache": "dkv"}, {"prophet": True, "answer_anchor": "20:x"}, {"rule": "klass"}, {"dpad_window": 8}):
        cfg = DecodeConfig(gen_len=32, block_len=16, batch_invariant=True, **extra)
        with pytest.raises(UserError, match="batch_invariant: not implemented with") as e:
            list(generate(lm.decoder, rows, cfg))
        assert "\n" not in str(e.value)
