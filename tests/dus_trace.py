"""fastdllm's decode as the accelerator tests compare it with an authors' transcription, step by step: per
row and step the committed (generation-relative position, token) pairs, and the Result (ours). Written for
DUS (tests/accelerators/test_dus.py) and used the same way by test_klass.py and test_local_leap.py."""

from __future__ import annotations

from fastdllm.decode.engine import StepEvent, generate


def ours(lm, prompts, cfg, monkeypatch=None):
    """Per row and step: the committed (generation-relative position, token) pairs; the Result."""
    steps, result = [[] for _ in prompts], None
    for event in generate(lm.decoder, prompts, cfg):
        if not isinstance(event, StepEvent):
            result = event
            continue
        for r in range(len(prompts)):
            hit = event.committed[r]
            steps[r].append(sorted(zip(event.positions[r][hit].tolist(), event.tokens[r][hit].tolist())))
    return steps, result
