"""Decoding settings: one dataclass that validates itself, built from dicts (profiles, flags, env)."""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .cache_modes import CACHE_MODES
from .combinations import refuse_pairs
from .config_values import ConfigError, check_field, parse_value
from .rules import RULES


def _choice(*options: str, help: str) -> Any:
    return field(default=options[0], metadata={"choices": options, "help": help})


@dataclass(frozen=True)
class DecodeConfig:
    gen_len: int = field(default=256, metadata={"min": 1, "help": "tokens to generate (canvas length)"})
    block_len: int = field(default=32, metadata={"min": 1, "help": "tokens per block; gen_len must be a multiple"})
    block_align: str | None = field(default=None, metadata={"choices": ("prompt", "grid"), "help": "where the first block starts: prompt = at the prompt's end; grid = at the multiple of block_len at or before it, the first block holding the prompt's tail and the last ending at the answer's end (dInfer's evaluation scripts' start_block_align); unset: prompt, or grid for block-causal families (always)"})
    sub_block_len: int | None = field(default=None, metadata={"min": 1, "help": "decode each block in sub-blocks of this many tokens, left to right (Fast-dLLM v2)"})
    cache: str = _choice(*CACHE_MODES, help="KV cache mode")
    mode: str = _choice("diffusion", "ar", "self_spec", help="Nemotron-Labs Diffusion's decoders: diffusion = its block decoding (generate), ar = one token per causal forward (ar_generate), self_spec = bidirectional drafts of block_len verified causally (linear_spec_generate, one prompt at a time); other families decode by diffusion only")
    rule: str = _choice(*RULES, help="commit rule (how many tokens per step)")
    threshold: float = field(default=0.9, metadata={"gt": 0.0, "max": 1.0, "help": "threshold rule: commit if confidence >= this"})
    factor: float = field(default=1.0, metadata={"gt": 0.0, "help": "factor rule: largest n with (n+1)(1-c_n) < factor"})
    frechet_margin: float = field(default=0.25, metadata={"min": 0.0, "max": 1.0, "help": "frechet rule (Fast-dLLM++): the margin delta its score, Frechet lower bound less 1 - c_n, must exceed (their frechet_margin; 0.25 in their tables)"})
    entropy_budget: float = field(default=0.35, metadata={"gt": 0.0, "help": "entropy_bounded rule: total entropy (nats) committed per step"})
    steps: int | None = field(default=None, metadata={"min": 1, "help": "fixed rule: total steps (default gen_len: one token per step)"})
    confidence: str = _choice("prob", "margin", "neg_entropy", "entropy", "logprob", "random", help="confidence measure")
    temperature: float = field(default=0.0, metadata={"min": 0.0, "help": "0 = greedy; > 0 samples (Gumbel-max)"})
    seed: int = field(default=0, metadata={"min": 0, "help": "random seed for sampling"})
    top_p: float = field(default=1.0, metadata={"min": 0.0, "max": 1.0, "help": "Steerling: nucleus sampling over the tokens whose mass before them is <= this (1: off)"})
    repetition_penalty: float = field(default=1.0, metadata={"min": 1.0, "help": "Steerling: logits of every id on the canvas divided (> 0) or multiplied (< 0) by this before choosing (1: off)"})
    entropy_sampling: bool = field(default=False, metadata={"help": "Steerling: its authors' entropy-adaptive temperature (0.3 to 0.7) then top_p; temperature is then unused"})
    entropy_bound: float = field(default=0.1, metadata={"gt": 0.0, "help": "eb_sampler rule: the entropy (nats) the accepted positions ranked before each may add up to; eb_gamma rule (RND1): the bound on their entropies less the largest"})
    dilation_base: int = field(default=2, metadata={"min": 1, "help": "dilated rule (DUS): each level's stride is the last one's divided by this (1: the whole block in one step)"})
    dilation_skip: int = field(default=1, metadata={"min": 1, "help": "dilated rule: the first stride is block_len / dilation_base**dilation_skip"})
    leap_anchor: float = field(default=0.9, metadata={"gt": 0.0, "max": 1.0, "help": "local_leap rule: an anchor (a scheduled commit) with confidence >= this lets its neighbours leap"})
    leap_neighbor: float = field(default=0.75, metadata={"gt": 0.0, "max": 1.0, "help": "local_leap rule: a candidate within leap_radius of such an anchor is committed too if its confidence is >= this"})
    leap_radius: int = field(default=4, metadata={"min": 0, "help": "local_leap rule: how many positions either side of an anchor its neighbours reach"})
    klass_kl: float = field(default=0.015, metadata={"gt": 0.0, "max": 10.0, "help": "klass rule: a masked candidate is stable once its KL between consecutive steps' distributions stayed below this for klass_history steps (it commits if also confidence > threshold)"})
    klass_history: int = field(default=2, metadata={"min": 1, "help": "klass rule: how many consecutive steps' KLs must stay below klass_kl"})
    denoise_steps: int = field(default=48, metadata={"min": 1, "help": "renoising samplers (DiffusionGemma): the most denoising steps per canvas"})
    t_max: float = field(default=0.8, metadata={"gt": 0.0, "help": "renoising samplers: the temperature at a canvas's first step (falling linearly to t_min)"})
    t_min: float = field(default=0.4, metadata={"min": 0.0, "help": "renoising samplers: the temperature the schedule falls towards at the last step"})
    stability_steps: int = field(default=1, metadata={"min": 0, "help": "renoising samplers: a canvas stops once its argmax is unchanged for this many steps and its mean entropy is below confidence_stop"})
    confidence_stop: float = field(default=0.005, metadata={"min": 0.0, "help": "renoising samplers: the mean entropy (nats) under which a stable canvas stops"})
    edit_threshold: float | None = field(default=None, metadata={"min": 0.0, "max": 1.0, "help": "token editing (LLaDA2.1): also overwrite a token written in the active block when the new argmax differs and its probability exceeds this (none: no editing)"})
    max_post_steps: int = field(default=16, metadata={"min": 0, "help": "token editing: the most edit-only rounds after a block has no mask left"})
    indel: bool = field(default=False, metadata={"help": "insert/delete editing (LLaDA2.2, docs/specs/llada2-2.md 3): token editing with edit_threshold plus the checkpoint's DELETE and SPLIT tokens, commits by threshold (at least one more than the masks edits opened)"})
    refresh_every: int | None = field(default=None, metadata={"min": 1, "help": "also refresh the cache every r steps inside a block"})
    prompt_interval: int = field(default=50, metadata={"min": 1, "help": "cache dllm_cache: recompute the prompt's attention/FFN features every this many steps (their prompt_interval_steps; 1: every step)"})
    gen_interval: int = field(default=7, metadata={"min": 1, "help": "cache dllm_cache: recompute the response's features every this many steps (their gen_interval_steps)"})
    transfer_ratio: float = field(default=0.25, metadata={"min": 0.0, "max": 1.0, "help": "cache dllm_cache: between response refreshes, recompute this share of the response, the slots whose value vectors changed most (0: none)"})
    batch_invariant: bool = field(default=False, metadata={"help": "a row's answer does not depend on the other rows of its batch, in any dtype: forwards run row by row on the slots the row has alone, logits at every block position (decode/batch_invariant.py; costs the batched matrix products)"})
    early_stop: bool = field(default=True, metadata={"help": "stop after the block where the answer ends"})
    variable_length: bool = field(default=False, metadata={"help": "variable-length decoding as iLLaDA's authors do it (their var): the canvas grows one block at a time, so a block's forwards see the prompt and the blocks before it, never masks after it; with early_stop it ends after the block where the answer ends (docs/specs/illada.md 3.2)"})
    block_steps: int | None = field(default=None, metadata={"min": 1, "help": "steps per block (the authors' steps under variable_length): total steps = block_steps x the number of blocks; not with steps"})
    end_think_boost: float = field(default=0.0, metadata={"min": 0.0, "help": "the end-of-thinking boost of iLLaDA's authors: while the answer holds no </think>, add end_think_boost x progress^end_think_power to the logit of its next token at the block's first masked position (progress: that position's offset over gen_len; 0: off; docs/specs/illada.md 3.4)"})
    end_think_power: float = field(default=2.0, metadata={"gt": 0.0, "help": "the power of the progress in end_think_boost (the authors' 3, or 1 for HumanEval)"})
    credit: bool = field(default=False, metadata={"help": "CreditDecoding (dInfer's use_credit): before the confidence, add credit_alpha log(1 + credit) to the logits, the credit being a block's decaying sum of p^credit_gamma for each position's argmax (docs/accelerators/credit.md 4)"})
    credit_alpha: float = field(default=0.7, metadata={"gt": 0.0, "help": "credit: the weight of log(1 + credit) added to the logits"})
    credit_gamma: float = field(default=0.2, metadata={"min": 0.0, "help": "credit: the power of each step's argmax probability that a masked position's credit gains"})
    credit_beta: float = field(default=0.8, metadata={"gt": 0.0, "max": 1.0, "help": "credit: the factor a block's credit decays by at each of its steps after the first"})
    prophet: bool = field(default=False, metadata={"help": "Prophet (early answer commit, docs/accelerators/prophet.md 3): at a step that recomputes the whole canvas, once the mean top-2 logit gap over the answer region reaches the phase's threshold, every remaining mask of the row takes this step's argmax and the row stops"})
    prophet_early: float = field(default=7.5, metadata={"help": "prophet: the gap to reach while progress < 0.33"})
    prophet_mid: float = field(default=5.0, metadata={"help": "prophet: the gap to reach while progress < 0.67"})
    prophet_late: float = field(default=2.5, metadata={"help": "prophet: the gap to reach after that"})
    answer_anchor: str | None = field(default=None, metadata={"help": "prophet: words written at generation offsets before the first step, 'offset:word|...' (e.g. '200:The|201:answer|202:is'); the answer region starts two slots after the last"})
    answer_tokens: int = field(default=5, metadata={"min": 1, "help": "prophet: the answer region's length (slots whose gaps are averaged)"})
    dpad_window: int | None = field(default=None, metadata={"min": 1, "help": "DPad (suffix dropout, docs/accelerators/dpad.md 2): at each block start keep the j-th masked slot after the block with probability dpad_scale * exp(-x^2/2) / sqrt(2 pi), x = j * dpad_k / (dpad_window - 1), never past this many slots; the rest is dropped from the forward (none: off)"})
    dpad_k: float = field(default=4.0, metadata={"min": 0.0, "help": "dpad: where the window ends, in standard deviations of the keep profile (their --k_sigma)"})
    dpad_scale: float = field(default=2.0, metadata={"gt": 0.0, "help": "dpad: the keep profile's scale (the keep probability right after the block is dpad_scale / sqrt(2 pi))"})
    focus_alpha: float | None = field(default=None, metadata={"min": 1.0, "help": "FOCUS (docs/accelerators/focus.md), block-causal families: each step keeps about ceil(focus_alpha x the tokens the block decoded per step so far) of its masked tokens, picked from layers 0 and 1's attention, and drops the rest from the rest of the forward (the authors' 1.5; none: off)"})
    focus_delayed: bool = field(default=True, metadata={"help": "focus: the authors' delayed cache, a decoded token whose right neighbour is decoded too is no longer recomputed in its block (off: every step recomputes the whole block, not the authors')"})

    def __post_init__(self) -> None:
        for f in fields(self):
            check_field(f, getattr(self, f.name))
        if self.gen_len % self.block_len:
            raise ConfigError(f"gen_len {self.gen_len} is not a multiple of block_len {self.block_len}")
        if self.sub_block_len is not None and self.block_len % self.sub_block_len:
            raise ConfigError(f"block_len {self.block_len} is not a multiple of sub_block_len {self.sub_block_len}")
        if self.steps is not None and self.block_steps is not None:
            raise ConfigError(f"steps {self.steps} (in all) and block_steps {self.block_steps} (per block): set one")
        rule = RULES[self.rule]
        if rule.scheduled and self.total_steps % self.num_blocks:
            raise ConfigError(
                f"steps {self.total_steps} is not divisible by the number of blocks {self.num_blocks} "
                f"(gen_len {self.gen_len} / block_len {self.block_len})")
        if rule.scheduled and self.total_steps > self.gen_len:
            raise ConfigError(f"block_steps {self.block_steps} exceeds block_len {self.block_len} (at most one step per token)"
                              if self.block_steps else
                              f"steps {self.total_steps} exceeds gen_len {self.gen_len} (at most one step per token)")
        if rule.whole_canvas and self.block_len != self.gen_len:
            raise ConfigError(f"the {self.rule} rule decodes one global canvas: block_len {self.block_len} must equal "
                              f"gen_len {self.gen_len} (leave block_len unset)")
        if rule.measure and self.confidence != rule.measure:
            raise ConfigError(f"the {self.rule} rule needs confidence {rule.measure} (got '{self.confidence}')")
        if rule.renoise and self.t_max < self.t_min:
            raise ConfigError(f"t_max {self.t_max} is below t_min {self.t_min} (the schedule falls from t_max to t_min)")
        if rule.needs_probability and self.confidence not in ("prob", "margin"):
            raise ConfigError(f"confidence '{self.confidence}' is not a probability; the {self.rule} rule needs prob or margin")
        if self.rule == "dilated" and self.steps is not None:
            raise ConfigError("the dilated rule takes one step per level (log_base of block_len); unset steps")
        if self.rule == "dilated" and self.sub_block_len is not None:
            raise ConfigError("the dilated rule plans a whole block; unset sub_block_len")
        if self.edit_threshold is not None:
            self._check_editing(rule)
        if self.indel and (self.edit_threshold is None or self.credit or self.prophet or self.dpad_window):
            raise ConfigError("indel: set edit_threshold (0 in LLaDA2.2's Speed mode); not combined with credit, "
                              "prophet or dpad")
        if self.indel and self.rule not in ("dynamic", "threshold"):
            raise ConfigError(f"indel commits by its own rule (masks above threshold, at least one more than the masks "
                              f"its edits opened); rule {self.rule} is not combined with it (use dynamic)")
        if self.credit and rule.renoise:
            raise ConfigError(f"credit accumulates over a masked block's steps; the {self.rule} rule resamples whole canvases")
        if self.credit and self.edit_threshold is not None:
            raise ConfigError("credit: edit_threshold re-decides written tokens; credit is defined for masked positions "
                              "only (unset one)")
        if self.rule == "klass":
            self._check_klass()
        if self.prophet:
            self._check_prophet(rule)
        if self.dpad_window is not None:
            self._check_dpad(rule)
        if self.block_align == "grid":
            self._check_grid(rule)
        if self.variable_length:                # growing.py: nothing after the current block exists yet
            refuse_pairs(self, "variable_length", ConfigError)
        if CACHE_MODES[self.cache].features:
            self._check_features(rule)
        if self.focus_alpha is not None:
            self._check_focus(rule)
        if CACHE_MODES[self.cache].delayed and self.sub_block_len is not None:   # (dpad: _check_dpad)
            raise ConfigError(f"cache {self.cache} recomputes masked slots anywhere; unset sub_block_len")

    def _check_focus(self, rule) -> None:
        """FOCUS (decode/focus.py) picks among a block's masked tokens inside its prefix-cached forward."""
        if self.cache != "prefix":
            raise ConfigError(f"focus_alpha: needs cache prefix (the block recomputed against the finished ones), "
                              f"not {self.cache}")
        if rule.bound or rule.renoise or rule.whole_canvas:
            raise ConfigError(f"focus_alpha: rule {self.rule} is not combined with it (use dynamic, the authors' "
                              f"LowConfidence, or threshold)")
        refuse_pairs(self, "focus_alpha", ConfigError)

    def _check_klass(self) -> None:
        """KLASS (decode/klass.py) is greedy and reads each step's distributions at the block itself."""
        if self.temperature > 0:
            raise ConfigError("the klass rule is greedy (the authors' KL with temperature reads Gumbel-noised "
                              "scores, not a distribution): set temperature 0")
        refuse_pairs(self, "klass", ConfigError)

    def _check_grid(self, rule) -> None:
        """Blocks on the grid (canvas.py): the number of blocks follows the prompt's length."""
        if rule.scheduled or rule.whole_canvas:
            raise ConfigError(f"block_align grid: the {self.rule} rule spreads its steps over gen_len / block_len "
                              f"blocks, and on the grid the first block holds the prompt's tail (use block_align prompt)")
        refuse_pairs(self, "grid", ConfigError)

    def _check_features(self, rule) -> None:
        """dLLM-Cache (models/feature_cache.py) splits one left-padded canvas at the prompt's end."""
        if rule.renoise:
            raise ConfigError(f"cache {self.cache} caches a mask decoder's features; the {self.rule} rule resamples whole canvases")
        if self.refresh_every is not None:
            raise ConfigError(f"cache {self.cache} refreshes by prompt_interval and gen_interval; unset refresh_every")
        refuse_pairs(self, "features", ConfigError)

    def _check_dpad(self, rule) -> None:
        """DPad (decode/suffix_dropout.py) drops masked slots after the active block."""
        if rule.renoise:
            raise ConfigError(f"dpad drops masked suffix slots; the {self.rule} rule resamples whole canvases")
        if rule.whole_canvas:
            raise ConfigError(f"dpad needs blocks after the active one; the {self.rule} rule decodes one global canvas")
        refuse_pairs(self, "dpad", ConfigError)
        if CACHE_MODES[self.cache].delayed:
            raise ConfigError(f"dpad: not combined with the {self.cache} cache (its delayed slots are canvas positions, "
                              f"not the compacted suffix); use none, prefix or dual")

    def _check_prophet(self, rule) -> None:
        """Prophet (decode/prophet.py) needs an anchor inside the canvas and a mask-committing loop."""
        if not self.answer_anchor:
            raise ConfigError(f"prophet: set answer_anchor (e.g. '{ANCHOR_EXAMPLE}'): the gap is measured on the tokens after it")
        try:
            last = max(pos for pos, _ in parse_anchor(self.answer_anchor))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if last + 2 >= self.gen_len:
            raise ConfigError(f"answer_anchor: offset {last} leaves no answer region inside gen_len {self.gen_len} "
                              f"(it starts two slots after the last anchor)")
        if rule.renoise:
            raise ConfigError(f"prophet commits masked positions early; the {self.rule} rule resamples whole canvases")
        refuse_pairs(self, "prophet", ConfigError)

    def _check_editing(self, rule) -> None:
        """Token editing (docs/specs/llada2-editing.md) compares the new token's probability, per whole block."""
        if rule.renoise:
            raise ConfigError(f"edit_threshold: the {self.rule} rule resamples whole canvases; editing belongs to mask decoding")
        if self.confidence != "prob":
            raise ConfigError(f"edit_threshold compares probabilities; confidence must be prob (got '{self.confidence}')")
        if self.sub_block_len is not None:
            raise ConfigError("edit_threshold: editing works on whole blocks; unset sub_block_len")

    @property
    def num_blocks(self) -> int:
        return self.gen_len // self.block_len

    @property
    def total_steps(self) -> int:
        if self.block_steps is not None:
            return self.block_steps * self.num_blocks
        return self.steps if self.steps is not None else self.gen_len

    @property
    def steps_per_block(self) -> int:
        return self.total_steps // self.num_blocks

    @classmethod
    def parse(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Check keys and each value on its own (type, choices, range); strings are converted.
        Cross-field rules (gen_len vs block_len, ...) are checked when a config is built."""
        known = {f.name: f for f in fields(cls)}
        parsed = {}
        for key, raw in values.items():
            name = key.replace("-", "_")
            if name not in known:
                hint = difflib.get_close_matches(name, known, n=1)
                raise ConfigError(f"unknown key '{key}'" + (f" (did you mean '{hint[0]}'?)" if hint else ""))
            parsed[name] = parse_value(known[name], raw)
            check_field(known[name], parsed[name])
        return parsed

    @classmethod
    def from_dict(cls, values: dict[str, Any], base: "DecodeConfig | None" = None) -> "DecodeConfig":
        """Apply `values` (keys = field names, values may be strings) over `base`; unknown keys are errors."""
        return replace(base or cls(), **cls.parse(values))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


ANCHOR_EXAMPLE = "200:The|201:answer|202:is"      # Prophet's eval (constraints_text)


def parse_anchor(text: str) -> list[tuple[int, str]]:
    """Prophet's answer_anchor: '200:The|201:answer' -> [(200, 'The'), (201, 'answer')]; ValueError
    (one line) if malformed."""
    parts = []
    for part in text.split("|"):
        pos, sep, word = part.partition(":")
        if not sep or not pos.strip().isdigit() or not word.strip():
            raise ValueError(f"answer_anchor: {part!r} is not offset:word (e.g. '{ANCHOR_EXAMPLE}')")
        parts.append((int(pos), word.strip()))
    return parts
