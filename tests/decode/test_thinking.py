"""The thought span (Gemma-4's `<|channel>thought ... <channel|>`, Qwen3's `<think> ... </think>`):
left out of the answer's text (ids unchanged); families without markers untouched; `--think`
switches the template's thinking, and pre-fills `<think>` where the switch alone changes nothing
(TraDo-Thinking's prompt); `chat --think` too."""

from __future__ import annotations

import pytest
from cli_runner import invoke

from fastdllm.checkpoints import loading
from fastdllm.checkpoints.thinking import without_thought

OPEN, CLOSE = 100, 101                 # Gemma-4's ids


@pytest.fixture(scope="module")
def gemma(tiny):
    return loading.load(tiny("diffusion_gemma"), dtype="fp32")


@pytest.mark.parametrize("ids, kept", [
    ([5, OPEN, 7, 8, CLOSE, 9], [5, 9]),                 # a thought between text
    ([OPEN, 7, CLOSE, 8, OPEN, 9, CLOSE], [8]),          # two thoughts
    ([5, OPEN, 7, 8], [5]),                              # still thinking when the canvas ended
    ([5, 6, CLOSE, 9], [9]),                             # the prompt opened the thought (a prefill)
    ([5, 6], [5, 6]),                                    # no thought
])
def test_without_thought(ids, kept):
    assert without_thought(ids, (OPEN, CLOSE)) == kept
    assert without_thought(ids, None) == ids


def test_the_answer_text_leaves_the_thought_out(gemma):
    assert gemma.thought == (OPEN, CLOSE)
    ids = gemma.tokenizer("<|channel>thought\nsecret plans<channel|>def main():", add_special_tokens=False)["input_ids"]
    assert gemma.detokenize(ids) == "def main():"
    assert "secret" in gemma.tokenizer.decode(ids, skip_special_tokens=True)     # what it would show otherwise


def test_families_without_the_channel_keep_their_text(tiny):
    lm = loading.load(tiny("llada"), dtype="fp32")
    assert lm.thought is None
    ids = lm.tokenizer("a plain answer", add_special_tokens=False)["input_ids"]
    assert lm.detokenize(ids) == lm.tokenizer.decode(ids, skip_special_tokens=True)


def test_chat_think_switches_the_template(gemma, monkeypatch):

    seen = []
    encode_messages = loading.LoadedModel.encode_messages
    monkeypatch.setattr(loading.LoadedModel, "encode_messages",
                        lambda self, messages, thinking=None: seen.append(thinking) or encode_messages(self, messages, thinking))
    for flag, thinking in (("--think", True), ("--no-think", False), (None, None)):
        seen.clear()
        r = invoke("chat", "-m", gemma.path, "-n", "16", *([flag] if flag else []), input="hi\n")
        assert r.exit_code == 0, r.output
        assert seen and set(seen) == {thinking}


def test_qwen3_think_prefills_an_opened_thought(tiny):
    """SDAR's Qwen3 template: thinking on changes nothing in the prompt (the model's choice), so
    `--think` opens the thought itself, as TraDo-8B-Thinking is prompted; `--no-think` is the
    template's empty thought; the answer's text starts after the thought's close."""

    lm = loading.load(tiny("sdar"), dtype="fp32")
    think, close = lm.tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    assert lm.thought == (think, close)
    text = lm.tokenizer.decode
    assert text(lm.encode("hi", thinking=True)) == text(lm.encode("hi")) + "<think>\n"
    assert text(lm.encode("hi", thinking=False)).endswith("<think>\n\n</think>\n\n")
    answer = lm.tokenizer("I should greet.</think>\n\nHello!", add_special_tokens=False)["input_ids"]
    assert close in answer and lm.detokenize(answer) == "\n\nHello!"
