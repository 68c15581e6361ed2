"""LocalLeap (Kong et al., arXiv 2510.07081; docs/accelerators/local-leap.md 6.2): each step commits the fixed
schedule's most confident candidates (the anchors), and besides them every candidate within
`leap_radius` positions of an anchor whose confidence reaches `leap_anchor`, if its own confidence
reaches `leap_neighbor`. Only masked positions of the active block are candidates, so a leap never
leaves the block. Torch-free at import (tensor methods only)."""

from __future__ import annotations

CHOSEN = 2.0   # added to a chosen candidate's confidence (at most 1): the chosen rank first, counted by it


def leap_key(conf, candidate, positions, scheduled, cfg):
    """(B, K) ranking key: the confidences, + CHOSEN where LocalLeap commits. conf (B, K) the
    candidates' confidences (probabilities), candidate (B, K) bool, positions (B, K) canvas
    positions, scheduled (B,) the anchors per row (the fixed schedule's count)."""
    conf = conf.masked_fill(~candidate, float("-inf"))
    order = conf.sort(dim=-1, descending=True, stable=True).indices
    rank = order.argsort(dim=-1)                                               # (B, K) each column's rank
    k = scheduled.clamp_min(1).minimum(candidate.sum(-1))                      # (B,) at least one, never beyond
    anchor = rank < k[:, None]
    strong = anchor & (conf >= cfg.leap_anchor)                                # (B, K)
    gap = (positions[:, :, None] - positions[:, None, :]).abs()                # (B, K, K) column to column
    near = ((gap <= cfg.leap_radius) & strong[:, None, :]).any(-1)             # within the radius of a strong anchor
    chosen = anchor | (near & candidate & (conf >= cfg.leap_neighbor))
    return conf + CHOSEN * chosen


def leap_count(sorted_key):
    """How many leap_key ranked first: the chosen ones."""
    return (sorted_key >= CHOSEN).sum(-1)
