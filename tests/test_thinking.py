"""The thought channel (Gemma-4's `<|channel>thought ... <channel|>`): left out of the answer's text
(ids unchanged); families without it untouched; `chat --think` switches the template's thinking."""

from __future__ import annotations

import pytest

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.thinking import without_thought
from fastdllm.checkpoints.tiny_gemma import write_diffusion_gemma

OPEN, CLOSE = 100, 101                 # Gemma-4's ids


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return loading.load(write_diffusion_gemma(tmp_path_factory.mktemp("ckpt") / "gemma-think"), dtype="fp32")


@pytest.mark.parametrize("ids, kept", [
    ([5, OPEN, 7, 8, CLOSE, 9], [5, 9]),                 # a thought between text
    ([OPEN, 7, CLOSE, 8, OPEN, 9, CLOSE], [8]),          # two thoughts
    ([5, OPEN, 7, 8], [5]),                              # still thinking when the canvas ended
    ([5, CLOSE, 9], [5, CLOSE, 9]),                      # a close without an open is left as it is
])
def test_without_thought(ids, kept):
    assert without_thought(ids, (OPEN, CLOSE)) == kept
    assert without_thought(ids, None) == ids


def test_the_answer_text_leaves_the_thought_out(gemma):
    assert gemma.thought == (OPEN, CLOSE)
    ids = gemma.tokenizer("<|channel>thought\nsecret plans<channel|>def main():", add_special_tokens=False)["input_ids"]
    assert gemma.detokenize(ids) == "def main():"
    assert "secret" in gemma.tokenizer.decode(ids, skip_special_tokens=True)     # what it would show otherwise


def test_families_without_the_channel_keep_their_text(tmp_path):
    from fastdllm.checkpoints.tiny_random import write_llada

    lm = loading.load(write_llada(tmp_path / "llada"), dtype="fp32")
    assert lm.thought is None
    ids = lm.tokenizer("a plain answer", add_special_tokens=False)["input_ids"]
    assert lm.detokenize(ids) == lm.tokenizer.decode(ids, skip_special_tokens=True)


def test_chat_think_switches_the_template(gemma, monkeypatch):
    from test_chat import invoke

    seen = []
    encode_messages = loading.LoadedModel.encode_messages
    monkeypatch.setattr(loading.LoadedModel, "encode_messages",
                        lambda self, messages, thinking=None: seen.append(thinking) or encode_messages(self, messages, thinking))
    for flag, thinking in (("--think", True), ("--no-think", False), (None, None)):
        seen.clear()
        r = invoke("-m", gemma.path, "-n", "16", *([flag] if flag else []), input="hi\n")
        assert r.exit_code == 0, r.output
        assert seen and set(seen) == {thinking}
