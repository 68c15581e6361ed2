"""What `bench` feeds the engine: each gen_len's inputs as templates (infill.Filling). A plain prompt
is a template without holes; an infilling prompt (PromptSet.suffixes) is prefix + hole + suffix,
the hole being the case's gen_len, decoded one at a time, raw text only."""

from __future__ import annotations

from ..decode.engine import infill_canvas
from ..decode.infill import Filling, for_model
from ..errors import UsageError, UserError
from ..units import plural
from .cases import Case
from .prompts import PromptSet


def check_infilling(prompt_set: PromptSet, cases: list[Case], chat: bool | None) -> None:
    """What an infilling set cannot run with (checked before the model loads where possible)."""
    if prompt_set.suffixes is None:
        return
    if chat:
        raise UsageError("--chat: infilling prompts are raw text (the template is the whole canvas)")
    if any(c.batch_size > 1 for c in cases):
        raise UsageError("--batch-size: infilling prompts run one at a time")


def prepare(lm, cases: list[Case], prompt_set: PromptSet, chat: bool | None) -> dict[int, list[Filling]]:
    """Each gen_len's engine inputs as templates: a plain prompt is one without holes, an infilling
    prompt is prefix + hole + suffix, the hole gen_len long. What would stop a row is raised here,
    before any row runs."""
    check_infilling(prompt_set, cases, chat)
    gen_lens, infilling = {c.cfg.gen_len for c in cases}, prompt_set.suffixes is not None
    if not infilling:
        inputs = dict.fromkeys(gen_lens, [Filling(lm.encode(p, chat=chat), [], [p]) for p in prompt_set.prompts])
    else:
        inputs = {g: [for_model(lm, [p, None, s], g) for p, s in zip(prompt_set.prompts, prompt_set.suffixes)]
                  for g in gen_lens}
    longest = max(f.text_tokens + g for g, fills in inputs.items() for f in fills)
    if longest > lm.context_length:
        raise UserError(f"longest {'prefix + suffix' if infilling else 'prompt'} + gen_len = {longest} tokens "
                        f"exceeds the model's context of {lm.context_length}")
    for c in cases:
        if c.batch_size > len(prompt_set.prompts):
            raise UsageError(f"--batch-size {c.batch_size} exceeds the {plural(len(prompt_set.prompts), 'prompt')}: "
                             f"raise --n-prompts")
        # each template planned as the mask loop plans it, so that its refusals (a block-causal
        # model, a hole at the start on a shifted one) come now, not after the first rows
        for f in inputs[c.cfg.gen_len] if infilling else []:
            infill_canvas(lm.decoder, f.ids, f.holes, c.cfg)
    return inputs
