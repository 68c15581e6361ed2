#!/usr/bin/env python3
"""The library comparison behind docs/specs/structured-output.md section 4: llguidance and xgrammar on the
same tokenizers (tokenizer setup, schema compile, mask + consume per token, checking a run of
tokens, refusals). Needs both installed (xgrammar is not a fastdllm dependency).

    python benchmarks/grammar_libraries.py fastdllm/checkpoints/builtin/tiny-code [OTHER_CHECKPOINT_DIR ...]
"""
import json, time, sys
from fastdllm.checkpoints.specials import load_tokenizer
import llguidance, llguidance.hf, llguidance.torch as lt
import xgrammar as xgr
import torch

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
          "age": {"type": "integer", "minimum": 0, "maximum": 150}}, "required": ["name", "age"], "additionalProperties": False}
text = '{"name":"Ada","age":36}'
for path in sys.argv[1:]:
    from pathlib import Path; tok = load_tokenizer(Path(path))
    V = len(tok)
    ids = tok.encode(text, add_special_tokens=False)
    # llguidance
    t = time.perf_counter(); lltok = llguidance.hf.from_tokenizer(tok); t_tok = time.perf_counter() - t
    t = time.perf_counter()
    g = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    m = llguidance.LLMatcher(lltok, g); t_comp = time.perf_counter() - t
    bm = lt.allocate_token_bitmask(1, lltok.vocab_size)
    t = time.perf_counter()
    for i in ids:
        lt.fill_next_token_bitmask(m, bm, 0); assert m.consume_token(i), i
    t_mask = (time.perf_counter() - t) / len(ids)
    m2 = llguidance.LLMatcher(lltok, g)
    t = time.perf_counter(); n = m2.validate_tokens(ids + [ids[0]]); t_val = time.perf_counter() - t
    print(f"llguidance {path.split('/')[-1]} V={V}: tokenizer {t_tok*1e3:.1f} ms, compile {t_comp*1e3:.2f} ms, "
          f"mask+consume {t_mask*1e3:.3f} ms/token, validate {len(ids)+1} tokens -> {n} in {t_val*1e3:.3f} ms, accepting {m.is_accepting()}")
    # xgrammar
    t = time.perf_counter(); info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=V); comp = xgr.GrammarCompiler(info); t_tok = time.perf_counter() - t
    t = time.perf_counter(); cg = comp.compile_json_schema(json.dumps(SCHEMA)); t_comp = time.perf_counter() - t
    xm = xgr.GrammarMatcher(cg); bm = xgr.allocate_token_bitmask(1, info.vocab_size)
    t = time.perf_counter()
    for i in ids:
        xm.fill_next_token_bitmask(bm); assert xm.accept_token(i), i
    t_mask = (time.perf_counter() - t) / len(ids)
    xm2 = xgr.GrammarMatcher(cg)
    t = time.perf_counter()
    n = 0
    for i in ids + [ids[0]]:
        if not xm2.accept_token(i): break
        n += 1
    xm2.rollback(n); t_val = time.perf_counter() - t
    print(f"xgrammar  {path.split('/')[-1]} V={V}: tokenizer {t_tok*1e3:.1f} ms, compile {t_comp*1e3:.2f} ms, "
          f"mask+accept {t_mask*1e3:.3f} ms/token, accept+rollback {len(ids)+1} tokens -> {n} in {t_val*1e3:.3f} ms, terminated {xm.is_terminated()}")
    # bad input
    for bad in ['{"type": "object", "properties": {"a": {"type": "strin"}}}', '{"type":"object","patternProperties":{"^a":{"type":"integer"}},"unknownKw":1}']:
        ok, errs = llguidance.LLMatcher.validate_grammar_with_warnings(llguidance.LLMatcher.grammar_from_json_schema(bad), lltok)
        try:
            comp.compile_json_schema(bad); xe = "accepted"
        except Exception as e:
            xe = str(e)[:100]
        print("  bad schema:", ok, errs[:2] if isinstance(errs, list) else errs, "| xgrammar:", xe)
