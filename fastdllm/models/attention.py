"""Attention kinds a family declares (as it declares its logit shift): bidirectional (LLaDA, Dream),
block-causal with the block size it was trained with (SDAR, Fast-dLLM v2, LLaDA2.x), or a causal
encoder with bidirectional canvases (DiffusionGemma)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Attention:
    """A family's attention kind, declared like its logit shift. Under block-causal attention a
    finished block's keys/values are final (the cache is exact); under bidirectional attention
    the cache modes above are approximations refreshed at each block start."""
    kind: str                       # "bidirectional" | "block-causal" | "causal-encoder" (DiffusionGemma:
                                    # canvases from the prompt's end, each bidirectional against a
                                    # causally encoded past)
    block: int | None = None        # block-causal: the block size it was trained with

    @property
    def causal(self) -> bool:
        """Block-causal: a finished block's keys/values are final, blocks are decoded in order."""
        return self.kind == "block-causal"

    @property
    def bidirectional(self) -> bool:
        """Every position attends to the whole canvas (the cache modes approximate)."""
        return self.kind == "bidirectional"

    def __str__(self) -> str:
        return self.kind if self.block is None else f"{self.kind}({self.block})"


BIDIRECTIONAL = Attention("bidirectional")
