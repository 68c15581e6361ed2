"""The built-in tiny-llada model's data: generated problems and function tasks are correct, and the
held-out splits (the tiny-gsm / tiny-code tasks) share nothing with training but the skills: no
held-out number band, person, object, phrasing or function combination appears in training rows."""

from __future__ import annotations

import random
import re

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from fastdllm.training import certainty, function_tasks, mixture, story_words, tokenizer, word_problems

TRAIN_DRAWS = 3000


def _numbers(text: str) -> set[int]:
    return {int(n) for n in re.findall(r"\d+", text)}


def test_worked_steps_are_right_and_end_in_the_target():
    rng = random.Random(0)
    problems = [word_problems.generate(rng, split) for split in ("train", "heldout") for _ in range(1500)]
    for p in problems:
        for a, op, b, c in re.findall(r"(\d+) ([-+*/]) (\d+) = \$?(\d+)", p["answer"]):
            a, b, c = int(a), int(b), int(c)
            assert {"+": a + b, "-": a - b, "*": a * b, "/": a // b if a % b == 0 else None}[op] == c, p
        assert p["answer"].endswith(f"#### {p['target']}") and int(p["target"]) >= 0


def test_held_out_problems_share_no_numbers_names_objects_or_phrasings_with_training():
    rng = random.Random(1)
    train = [word_problems.generate(rng, "train") for _ in range(TRAIN_DRAWS)]
    held = word_problems.held_out_set(200)
    band = set(word_problems.HELD_BAND)
    assert not any(_numbers(p["question"]) & band for p in train)
    assert all(_numbers(p["question"]) & band for p in held)
    train_words = {w for p in train for w in re.findall(r"[A-Za-z]+", p["question"] + p["answer"])}
    for key in ("NAMES", "ITEMS", "CONTAINERS"):
        assert not set(getattr(word_problems, key)["heldout"]) & train_words, key
    held_only_kinds = {"fewer_than", "pages_left", "shared_bill"}
    assert not held_only_kinds & {p["kind"] for p in train}
    assert held_only_kinds <= {p["kind"] for p in held}
    assert not any("What is the number of" in p["question"] or "arrive for" in p["question"] for p in train)
    assert word_problems.held_out_set(200) == held                 # the same set every time


def test_training_people_things_and_parameters_are_often_made_up_and_never_held_out():
    rng = random.Random(4)
    problems = [word_problems.generate(rng, "train") for _ in range(300)]
    words = {w for p in problems for w in re.findall(r"[A-Za-z]+", p["question"])}
    fixed = set(word_problems.NAMES["train"] + word_problems.ITEMS["train"])
    made_up_names = {w for w in words if w[0].isupper() and w not in fixed and w.lower()[:2] in story_words.SYLLABLES}
    assert len(made_up_names) > 100                      # hundreds of names no list holds: copy, not recall
    held = {w.lower() for w in word_problems.NAMES["heldout"] + word_problems.ITEMS["heldout"]}
    assert not held & {w.lower() for w in words}
    params = set()
    for _ in range(300):
        task = function_tasks.generate(rng, "train", classics=0.0)
        params.add(re.match(r"def \w+\((\w+)", task["prompt"]).group(1))
        namespace = {}
        exec(task["prompt"] + task["canonical_solution"] + task["test"], namespace)
        namespace["check"](namespace[task["entry_point"]])        # a made-up name never shadows the body's own
    assert len(params - set(function_tasks.LIST_PARAMS["train"] + function_tasks.STRING_PARAMS["train"])) > 50
    assert not params & set(function_tasks.LIST_PARAMS["heldout"] + function_tasks.STRING_PARAMS["heldout"])


def test_function_tasks_pass_their_own_tests_and_held_out_combinations_are_unseen():
    rng = random.Random(2)
    train = [function_tasks.generate(rng, "train") for _ in range(TRAIN_DRAWS)]
    held = function_tasks.held_out_set(164)
    for task in held + train[:200]:
        scope: dict = {}
        exec(task["prompt"] + task["canonical_solution"] + task["test"], scope)
        scope["check"](scope[task["entry_point"]])
        assert task["prompt"].startswith(f"def {task['entry_point']}(")
        assert '"""' in task["prompt"] or task["kind"].startswith("classic:")   # classics: also bare signatures
    assert not {t["kind"] for t in train} & {t["kind"] for t in held}
    assert not any("Compute and return" in t["prompt"] for t in train)
    held_params = set(function_tasks.LIST_PARAMS["heldout"] + function_tasks.STRING_PARAMS["heldout"])
    assert not any(re.search(rf"\(({'|'.join(held_params)})\)", t["prompt"]) for t in train)
    parts = {part for t in held for part in t["kind"].split(":")[1:]}
    trained = {part for t in train for part in t["kind"].split(":")[1:]}
    assert parts <= trained                                         # every held-out part is trained


def _char_tokenizer() -> tuple[Tokenizer, dict[str, int]]:
    """A tiny BPE with the LLaDA specials (no merges: enough to check row layout)."""
    texts = [word_problems.generate(random.Random(i), "train")["question"] for i in range(50)]
    tok = tokenizer.train_bpe(texts + ["def f(x):\n    return x\n"], vocab_size=300, split_digits=True)
    return tok, {t: tok.token_to_id(t) for t in tokenizer.SPECIALS}


def test_rows_pad_answers_with_end_of_text_and_chat_answers_end_their_turn():
    tok, ids = _char_tokenizer()
    mix = mixture.Mixture(tok, torch.arange(10, 2000), [("def f(x):\n", "    return x\n")], ids,
                          row_lengths=((192, 1.0),))
    rng = random.Random(3)
    tokens, prompt = mix.batch(64, rng)
    assert tokens.shape == (64, 192)
    for row, p in zip(tokens.tolist(), prompt.tolist()):
        if p == 0:                                                 # a stdlib window
            continue
        text = tok.decode(row[:p], skip_special_tokens=False)
        end = row.index(ids[tokenizer.EOS], p)
        assert set(row[end:]) == {ids[tokenizer.EOS]}              # padding to the row end
        if text.startswith(tokenizer.BOS):                         # chat: the turn ends before the padding
            assert row[end - 1] == ids[tokenizer.EOT] and text.endswith("assistant<|end_header_id|>\n\n")
    assert len({tuple(r) for r in tokens.tolist()}) > 40           # fresh draws (the one stdlib function repeats)


def test_tight_batches_pad_like_lengths_a_little_and_resume_exactly():
    tok, ids = _char_tokenizer()
    eos = ids[tokenizer.EOS]
    mix = mixture.Mixture(tok, torch.arange(10, 2000), [("def f(x):\n", "    return x\n")], ids,
                          row_lengths=((0, 1.0),))
    rng = random.Random(5)
    spans = []
    for _ in range(mixture.TIGHT_GROUP):
        tokens, prompt = mix.batch(16, rng)
        content = [max(i for i, t in enumerate(row) if t != eos) + 1      # where each prompted row's answer ends
                   for row, p in zip(tokens.tolist(), prompt.tolist()) if p]
        assert 1 <= tokens.shape[1] - max(content) <= 16        # the longest row ends 1-16 tokens before the end
        spans.append((min(content), max(content)))
    assert all(hi - lo < 100 for lo, hi in spans) and len({lo for lo, _ in spans}) > 3   # groups of like lengths
    source = mixture.MixtureSource.__new__(mixture.MixtureSource)   # the resume state: rng and undrawn groups
    source.rng, source.mixture = rng, mix
    mix.batch(16, rng)
    saved = source.get_state()
    saved = {"rng": saved["rng"], "pending": [list(g) for g in saved["pending"]]}
    after = [mix.batch(16, rng)[0] for _ in range(3)]
    source.set_state(saved)
    assert all(torch.equal(a, mix.batch(16, rng)[0]) for a in after)


def test_digits_are_single_tokens():
    tok, _ = _char_tokenizer()
    pieces = tok.encode("She has 1234 apples").tokens
    assert [p for p in pieces if p.strip("Ġ").isdigit()] == ["1", "2", "3", "4"]


def test_block_masks_are_the_states_block_decoding_meets():
    tokens = torch.arange(100, 100 + 4 * 160).reshape(4, 160)
    prompt = torch.tensor([16, 16, 16, 0])
    rng = random.Random(4)
    for _ in range(20):
        noisy, masked, weight = mixture.block_mask_batch(tokens, prompt, 2, rng, block_share=1.0, block=32)
        for r in range(3):
            m = masked[r].tolist()
            assert not any(m[:16])                                 # the prompt is never masked
            first = m.index(True) if any(m) else 160
            lo = 16 + (first - 16) // 32 * 32                      # the block holding the first mask
            assert all(m[lo + 32:])                                # everything after that block is masked
            assert (weight[r][lo + 32:] == 1).all()
        assert (noisy[masked] == 2).all() and (weight[~masked] == 0).all()
        assert masked[3].any()                                     # no prompt: masked as LLaDA trains


def test_uniform_masks_weigh_each_masked_token_by_one_over_t():
    tokens = torch.arange(100, 164).reshape(1, 64)
    noisy, masked, weight = mixture.block_mask_batch(tokens, torch.tensor([8]), 2, random.Random(5), block_share=0.0)
    w = weight[masked]
    assert not masked[0, :8].any() and torch.allclose(w, w[0].expand_as(w)) and w[0] >= 1


def test_the_tokenizer_model_is_byte_level_bpe():
    tok, _ = _char_tokenizer()
    assert isinstance(tok.model, models.BPE) and isinstance(tok.pre_tokenizer, pre_tokenizers.Sequence)


def test_certainty_masks_pair_each_block_with_its_complement():
    prompt, L = torch.tensor([10, 10, 40]), 138
    blocks_seen = set()
    for seed in range(30):
        masked, complement = certainty.semi_ar_masks(prompt, L, random.Random(seed), block=32)
        for r, start in enumerate(prompt.tolist()):
            m, c = masked[r], complement[r]
            lo = int((m | c).nonzero()[0])                            # the block being decoded
            hi = min(lo + 32, L)
            blocks_seen.add((start, (lo - start) // 32))
            assert lo >= start and (lo - start) % 32 == 0
            assert not (m[:lo].any() or c[:lo].any())                 # prompt and earlier blocks clean
            assert (m[lo:hi] ^ c[lo:hi]).all()                        # the block: each position in one of the two
            assert (m[hi:] & c[hi:]).all()                            # after it: masked in both
    assert {b for s, b in blocks_seen if s == 10} == {0, 1, 2, 3}     # every block of the answer, the short last one too


def test_certainty_loss_is_cross_entropy_plus_entropy_where_already_right():
    tokens = torch.tensor([[1, 2, 3]])
    masked = torch.tensor([[False, True, True]])
    logits = torch.tensor([[[0.0, 5.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0], [0.0, 3.0, 0.0, 1.0]]])
    ce = torch.nn.functional.cross_entropy(logits[masked], tokens[masked])
    assert torch.isclose(certainty.certainty_loss(logits, tokens, masked, 0.0, 0.5), ce)
    p = torch.softmax(logits[0, 1] / 0.5, -1)                        # position 1 is right (argmax 2), 2 is wrong
    entropy = -(p * p.log()).sum()
    assert torch.isclose(certainty.certainty_loss(logits, tokens, masked, 2.0, 0.5), ce + 2 * entropy)


def test_drill_lines_are_right_and_drill_rows_have_no_prompt():
    rng = random.Random(5)
    for _ in range(2000):
        left, right = word_problems.drill_line(rng).split(" = ")
        a, op, b = left.split()
        assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b),
                "/": int(a) // int(b) if int(a) % int(b) == 0 else None}[op] == int(right) >= 0
    tok, ids = _char_tokenizer()
    mix = mixture.Mixture(tok, torch.arange(10, 2000), [], ids, row_lengths=((128, 1.0),), weights={"arith": 1.0})
    tokens, prompt = mix.batch(4, rng)
    assert tokens.shape == (4, 128) and prompt.tolist() == [0, 0, 0, 0]
    assert " = " in tok.decode(tokens[0].tolist())


def test_echo_rows_repeat_a_training_prompt_verbatim():
    rng = random.Random(4)
    for _ in range(40):
        prompt, answer = mixture.texts(rng, "echo", [])
        assert prompt == answer + "\nSay it again:\n" and len(answer) > 20


def test_flat_loss_weighs_every_masked_token_one(monkeypatch):
    from types import SimpleNamespace

    seen = {}
    monkeypatch.setattr(mixture.data, "forward_loss", lambda model, noisy, tokens, weight, prompt: seen.update(
        noisy=noisy, weight=weight))
    source = mixture.MixtureSource.__new__(mixture.MixtureSource)
    tokens, prompt = torch.randint(10, 50, (6, 40)), torch.tensor([5, 9, 0, 12, 3, 20])
    for kind, values in (("flat", {0.0, 1.0}), ("elbo", None)):
        source.cfg, source.rng = SimpleNamespace(block_share=0.5, loss_weight=kind), random.Random(2)
        source.loss(None, tokens, prompt, mask_id=2)
        masked = seen["noisy"] == 2
        assert torch.equal(seen["weight"] > 0, masked)
        assert set(seen["weight"].unique().tolist()) == values if values else bool((seen["weight"][masked] >= 1).all())


def test_the_default_mixture_draws_every_kind_it_weighs_echo_rows_included():
    # The echo rows once had a generator and no share, so no batch ever held one: draw from the
    # recipe's own weights and find each kind's mark in the rows.
    assert abs(sum(mixture.WEIGHTS.values()) - 1) < 1e-9 and mixture.WEIGHTS["echo"] >= 0.1
    tok, ids = _char_tokenizer()
    mix = mixture.Mixture(tok, torch.arange(10, 2000), [("def f(x):\n", "    return x\n")], ids,
                          row_lengths=((256, 1.0),))
    rng, echoes, repeats = random.Random(6), 0, 0
    newline, specials = tok.encode("\n").ids, set(ids.values())
    for _ in range(4):
        tokens, prompt = mix.batch(32, rng)
        for row, p in zip(tokens.tolist(), prompt.tolist()):
            text = tok.decode(row[:p])
            echoes += text.endswith("\nSay it again:\n") and tok.decode(row[p:]).startswith(text[:-len("\nSay it again:\n")])
            n = next((n for n in range(8, 65) if row[n:n + len(newline)] == newline
                      and row[:n] == row[n + len(newline):2 * n + len(newline)]), None)
            repeats += p == 0 and n is not None and not specials & set(row[:n])
    assert 4 <= echoes <= 30      # 12% of 128 rows is about 15
    assert 3 <= repeats <= 22     # 8%: about 10


def test_a_curriculum_stage_names_its_kinds_and_unknown_kinds_are_refused():
    assert mixture.weights_of("mixture") == mixture.WEIGHTS
    assert mixture.weights_of("repeat:0.6, echo:0.4") == {"repeat": 0.6, "echo": 0.4}
    with pytest.raises(ValueError, match="unknown kinds \\['repet'\\]"):
        mixture.weights_of("repet:1")
    tok, ids = _char_tokenizer()
    mix = mixture.Mixture(tok, torch.arange(10, 2000), [], ids, row_lengths=((128, 1.0),),
                          weights=mixture.weights_of("repeat:1"))
    tokens, prompt = mix.batch(8, random.Random(7))
    assert prompt.tolist() == [0] * 8
    for row in tokens.tolist():                       # each row: n tokens, a newline, the same n tokens
        n = next(n for n in range(8, 65) if row[:n] == row[n + 1:2 * n + 1])
        assert tok.decode(row[n:n + 1]) == "\n"


def test_repeat_rows_draw_from_the_digits_a_short_alphabet_or_the_whole_vocabulary():
    tok, ids = _char_tokenizer()
    specials = set(ids.values())
    digits = mixture.repeat_alphabet(tok, specials, 10)
    assert [tok.decode([i]) for i in digits] == [str(d) for d in range(10)]
    assert len(mixture.repeat_alphabet(tok, specials, 32)) == 32
    everything = mixture.repeat_alphabet(tok, specials, 0)
    assert len(everything) == tok.get_vocab_size() - len(specials) and not specials & set(everything)
    mix = mixture.Mixture(tok, torch.arange(10, 2000), [], ids, row_lengths=((128, 1.0),),
                          weights=mixture.weights_of("repeat:1"))
    rng, kinds = random.Random(8), {"digits": 0, "other": 0}
    for _ in range(4):
        for row in mix.batch(16, rng)[0].tolist():
            n = next(n for n in range(8, 65) if row[:n] == row[n + 1:2 * n + 1])
            kinds["digits" if set(row[:n]) <= set(digits) else "other"] += 1
    assert 25 <= kinds["digits"] <= 52 and kinds["other"] >= 8     # 60% of 64 rows are digits


def test_a_curriculum_stage_sets_the_repeat_alphabets():
    tok, ids = _char_tokenizer()
    digits = set(mixture.repeat_alphabet(tok, set(ids.values()), 10))
    mix = mixture.Mixture(tok, torch.arange(10, 2000), [], ids, row_lengths=((128, 1.0),),
                          weights=mixture.weights_of("repeat:1"), repeat_alphabets=mixture.shares("10:1"))
    rows = mix.batch(16, random.Random(3))[0].tolist()
    firsts = [row[:8] for row in rows]
    assert all(set(first) <= digits for first in firsts)
    mix.repeat_alphabets = mixture.shares("0:1")      # the whole vocabulary: digits only by chance
    rows = mix.batch(16, random.Random(3))[0].tolist()
    assert sum(set(row[:8]) <= digits for row in rows) == 0
