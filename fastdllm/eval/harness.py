"""An lm-evaluation-harness model backed by the fastdllm engine, registered as "fastdllm".

- generate_until: requests with the same generation settings are decoded in batches (left
  padding, engine.run); `max_gen_toks` (the request's, or the one given to the model, which
  replaces it) is the canvas, rounded up to whole blocks, and the answer is cut there, at its end
  token and at the first `until` string.
- loglikelihood (bidirectional families): the Monte Carlo estimate of LLaDA's own evaluation
  (ML-GSAI/LLaDA eval_llada.py), see `Likelihood`; block-causal families refuse it in one line.
- `stats` counts what the answers cost: answer tokens (up to the end token, never the prompt),
  forwards, committed positions, seconds.

From lm-eval's own command line: `python -m fastdllm.eval.harness --model fastdllm --model_args
pretrained=DIR,profile=NAME,... --tasks ...` (lm-eval finds models only in its own table; this is
its CLI with fastdllm registered), under `torchrun` / `accelerate launch` as well.

Parallel runs (distributed.py) follow lm-eval's protocol for its own models: `rank` and
`world_size` make lm-eval give each process documents rank, rank + N, ... and pad the shorter
shares with copies of their last request (answered here from the original, not decoded);
`gather_object` hands rank 0 the per-document metrics in the single process's document order,
so that sums and standard errors come out bit-identical.

Seeds: a request that draws random numbers (temperature > 0, random confidence, a renoising
sampler) is decoded alone, its k-th copy (lm-eval's `repeats`) with seed + k: its answer is
`generate --seed` on that prompt whatever its rank, batch or order. Greedy requests share batches.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from ..decode.canvas import block_end
from ..decode.config import DecodeConfig
from ..decode.engine import run
from ..errors import UserError
from . import distributed
from .likelihood import Likelihood

SAMPLING_OFF = {"top_p": (None, 1, 1.0), "top_k": (None, 0, -1)}


@dataclass
class Stats:
    answers: int = 0                # generated answers, or continuations scored
    answer_tokens: int = 0          # up to each answer's end token (and max_gen_toks)
    forwards: int = 0               # engine forwards (a batch's forward counts once)
    answer_forwards: int = 0        # forwards summed over answers (a row's share of each batch)
    committed: int = 0
    row_forwards: int = 0           # forwards x rows: what tokens per forward is counted over
    seconds: float = 0.0


@register_model("fastdllm")
class FastdllmLM(LM):
    def __init__(self, pretrained: str | None = None, profile: str | None = None, dtype: str = "auto",
                 device: str = "auto", quantize: str = "none", batch_size: int | str = 1, mc_num: int = 128,
                 mc_batch: int = 32, check_greedy: bool = True, lm=None, cfg: DecodeConfig | None = None,
                 max_batch_size: int | None = None, world: distributed.World | None = None,
                 max_gen_toks: int | str | None = None, **decode):
        """From lm-eval: `pretrained` (a checkpoint directory; default the built-in model), `profile`
        and any decoding setting (threshold=0.9, cache=dual, ...). From `fastdllm eval`: a loaded
        model `lm` and its resolved `cfg`. `max_gen_toks` replaces every request's own (`eval
        --gen-lens`: one answer length for every task). (`max_batch_size`, which lm-eval may pass,
        is unused.)"""
        super().__init__()
        self.world = world or distributed.from_env()
        self._rank, self._world_size = self.world.rank, self.world.size
        if lm is None:
            from ..checkpoints import loading
            from ..checkpoints.locate import resolve_model_dir
            from ..decode import profiles
            from ..checkpoints.placement import bf16_load_note

            if str(device).startswith("cuda") and not torch.cuda.is_available():   # lm-eval's default is cuda:0
                print(f"note: no CUDA device for lm-eval's --device {device}: placing the model as fastdllm "
                      f"does (auto)", file=sys.stderr)
                device = "auto"
            model_dir = resolve_model_dir(pretrained)
            found = profiles.find(profile or profiles.default_profile_for(model_dir))
            cfg = profiles.resolve(found, decode, model_dir)
            if self.world.size > 1 and str(device).startswith("cuda:"):
                device = "cuda"                # lm-eval's one device: here each rank's own GPU
            self.world.share_threads()
            lm = loading.load(model_dir, dtype=dtype, device=self.world.device(device), quantize=quantize)
            if slow := bf16_load_note(lm):
                print(f"note: {slow}", file=sys.stderr)
        self.lm, self.cfg = lm, cfg or DecodeConfig()
        self.max_gen_toks = int(max_gen_toks) if max_gen_toks is not None else None
        self.rows = int(batch_size) if str(batch_size).isdigit() else 1
        self.likelihood = Likelihood(lm, mc_num=int(mc_num), mc_batch=int(mc_batch), seed=self.cfg.seed,
                                     check_greedy=str(check_greedy).lower() not in ("false", "0", "no"))
        self.stats = Stats()
        self.progress = None                   # called with (requests done, requests) as they finish
        self.task: str | None = None           # the task running (the name the test hook matches)
        self.templated = False                 # set once lm-eval applies the chat template
        self.failure: str | None = None        # parallel runs: this rank's error, reported after the task

    # ------------------------------------------------------------------ lm-eval's collectives
    def all_gather(self, tensor):
        return torch.stack([torch.as_tensor(t) for t in self.world.all_gather(tensor.cpu())]).flatten()

    def gather_object(self, obj, dst: int = 0):
        parts = self.world.all_gather(obj)
        return distributed.in_document_order(parts) if self.rank == dst else None

    def barrier(self) -> None:
        self.world.all_gather(None)

    @property
    def tokenizer_name(self) -> str:
        return str(self.lm.path.name)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.lm.tokenizer, "chat_template", None) or ""

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not self.lm.has_chat_template:
            raise UserError(f"{self.lm.path.name} has no chat template: run without --chat")
        self.templated = True                  # lm-eval asks for it only when a run chat-templates
        return self.lm.tokenizer.apply_chat_template(chat_history, add_generation_prompt=add_generation_prompt,
                                                     tokenize=False)

    def encode(self, text: str) -> list[int]:
        """A context as the model's own tokenizer gives it: with its BOS token when it adds one and
        the text (a chat template's output) does not start with it already; also where the family's
        authors evaluate plain prompts with a BOS their tokenizer does not add (`eval_prompt_bos`)."""
        tokenizer = self.lm.tokenizer
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        bos = tokenizer.bos_token_id
        authors_bos = self.lm.model.eval_prompt_bos and not self.templated
        adds_bos = bos is not None and (authors_bos or tokenizer("x")["input_ids"][:1] == [bos])
        return [bos] + ids if adds_bos and ids[:1] != [bos] else ids

    # ------------------------------------------------------------------ generate_until
    def generate_until(self, requests) -> list[str]:
        return self._guarded(self._generate_until, requests, "")

    def _generate_until(self, requests) -> list[str]:
        copy = distributed.copies(requests)
        out: list[str | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, request in enumerate(requests):
            if copy[i] is not None:
                groups.setdefault(self._settings(request.args[1]), []).append(i)
        done, total = 0, sum(len(m) for m in groups.values())
        for settings, members in groups.items():
            cfg, limit, until = self._config(settings)
            members.sort(key=lambda i: -len(requests[i].args[0]))            # similar lengths share a batch
            rows = 1 if self._draws(cfg) else self.rows
            for start in range(0, len(members), rows):
                batch = members[start:start + rows]
                batch_cfg = replace(cfg, seed=cfg.seed + copy[batch[0]]) if rows == 1 else cfg
                texts = self._decode([self.encode(requests[i].args[0]) for i in batch], batch_cfg, limit, until)
                for i, text in zip(batch, texts):
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                done += len(batch)
                if self.progress:
                    self.progress(done, total)
        return distributed.padded(requests, out)

    def _draws(self, cfg: DecodeConfig) -> bool:
        """Whether decoding draws random numbers (then the request is decoded alone: its stream)."""
        renoise = self.lm.decoder.model.sampler == "renoise"
        return cfg.temperature > 0 or cfg.confidence == "random" or renoise

    def _guarded(self, method, requests, placeholder):
        """Parallel runs: an error here is kept and the rank answers the rest with placeholders, so
        that lm-eval's collectives still meet on every rank; tasks.py reports it after the task."""
        try:
            if self.failure is None:
                distributed.injected(self.world, self.task)
                return method(requests)
        except Exception as e:
            if self.world.size == 1:
                raise
            self.failure = distributed.describe(e)
        return [placeholder] * len(requests)

    def _settings(self, kwargs: dict) -> tuple:
        kwargs = dict(kwargs or {})
        until = kwargs.pop("until", None)
        until = tuple([until] if isinstance(until, str) else until or ())
        asked = int(kwargs.pop("max_gen_toks", self.cfg.gen_len))
        limit = self.max_gen_toks or asked
        sample = bool(kwargs.pop("do_sample", False))
        temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
        for key, off in SAMPLING_OFF.items():
            if kwargs.pop(key, None) not in off:
                raise UserError(f"the task asks for {key} sampling, which fastdllm does not implement")
        return until, limit, temperature if sample else 0.0

    def _config(self, settings: tuple) -> tuple[DecodeConfig, int, tuple[str, ...]]:
        until, limit, temperature = settings
        cfg = self.cfg
        gen_len = block_end(limit, cfg.block_len)
        steps = None if cfg.steps is None else cfg.steps_per_block * (gen_len // cfg.block_len)
        return replace(cfg, gen_len=gen_len, steps=steps, temperature=temperature), limit, until

    def _decode(self, prompts: list[list[int]], cfg: DecodeConfig, limit: int, until: tuple[str, ...]) -> list[str]:
        longest = max(len(p) for p in prompts)
        if longest + cfg.gen_len > self.lm.context_length:
            raise UserError(f"a prompt of {longest} tokens and {cfg.gen_len} to generate exceed the model's context "
                            f"of {self.lm.context_length} tokens (lower --num-fewshot or the task's max_gen_toks)")
        result = run(self.lm.decoder, prompts, cfg)
        texts = []
        for ids in result.ids:
            ids = ids[:limit]
            text = self.lm.detokenize(ids)
            cut = [i for i in (text.find(s) for s in until if s) if i >= 0]
            texts.append(text[:min(cut)] if cut else text)
            self.stats.answer_tokens += len(ids)
        s = self.stats
        s.answers += len(prompts)
        s.forwards += result.nfe
        s.answer_forwards += result.nfe * len(prompts)
        s.committed += result.committed
        s.row_forwards += result.nfe * result.batch
        s.seconds += result.seconds_total
        return texts

    # ------------------------------------------------------------------ likelihoods
    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        return self._guarded(self._loglikelihood, requests, (0.0, False))

    def _loglikelihood(self, requests) -> list[tuple[float, bool]]:
        copy = distributed.copies(requests)
        out: list[tuple[float, bool] | None] = [None] * len(requests)
        done, total = 0, sum(k is not None for k in copy)
        for i, request in enumerate(requests):
            if copy[i] is None:
                continue
            context, continuation = request.args
            started, forwards = time.perf_counter(), self.likelihood.forwards
            answer = self.likelihood.score(*self._pair(context, continuation))
            s = self.stats
            s.seconds += time.perf_counter() - started
            s.answers += 1
            s.forwards += self.likelihood.forwards - forwards
            s.answer_forwards += self.likelihood.forwards - forwards
            out[i] = answer
            self.cache_hook.add_partial("loglikelihood", request.args, answer)
            done += 1
            if self.progress:
                self.progress(done, total)
        return distributed.padded(requests, out)

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids): trailing spaces of the context belong to the
        continuation, and the continuation is what the whole text adds to the context's tokens."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, head = self.encode(context + continuation), self.encode(context)
        return head, whole[len(head):]

    def loglikelihood_rolling(self, requests) -> list[float]:
        raise UserError("perplexity tasks (loglikelihood_rolling) are not supported: a diffusion model has no "
                        "left-to-right likelihood to roll over a document")


def main() -> None:
    """lm-eval's command line with "fastdllm" registered (`python -m fastdllm.eval.harness --model fastdllm ...`)."""
    from lm_eval.__main__ import cli_evaluate

    from .task_index import cached_index

    try:
        with cached_index():                    # lm-eval's own tasks' index from disk (task_index.py)
            cli_evaluate()
    except UserError as e:                      # a user's mistake: one line, as fastdllm's commands
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
