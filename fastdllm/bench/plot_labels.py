"""Scatter labels that can be read: each label beside its point, covering no other label, point or legend.

Labels are placed one at a time, in pixels as drawn: a label takes the first offset from a ring of
candidates around its point (nearest first) whose box overlaps no label placed before it, no
point's marker and not the legend, and stays inside the axes; failing all of them, the farthest
ring with a thin line back to the point. Call it once the axes' limits and the figure's layout are
final (it draws the figure to measure text), and save at the figure's own dpi.
"""

from __future__ import annotations

# Offsets in points (x, y, horizontal alignment), nearest first: right, left, above, below, then farther.
RINGS = [(6, 3), (6, 14), (16, 26), (26, 40)]
LEADER = {"arrowstyle": "-", "lw": 0.5, "color": "grey", "shrinkA": 0, "shrinkB": 3}
MARKER_PX = 5              # half the width of the box kept clear around each point, in pixels


def _candidates():
    for step, (dx, dy) in enumerate(RINGS):
        for sx, sy in ((1, 1), (1, -1), (-1, 1), (-1, -1)):
            yield dx * sx, dy * sy - (4 if sy < 0 else 0), "left" if sx > 0 else "right", step


def place_labels(ax, points: list[tuple[str, float, float]], fontsize: float = 8) -> list:
    """Annotate (label, x, y) points on `ax` (already scattered); returns the annotations."""
    from matplotlib.transforms import Bbox

    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    taken = []                                       # boxes (display pixels) no label may overlap
    for _, x, y in points:
        px, py = ax.transData.transform((x, y))
        taken.append(Bbox.from_extents(px - MARKER_PX, py - MARKER_PX, px + MARKER_PX, py + MARKER_PX))
    if ax.get_legend() is not None:
        taken.append(ax.get_legend().get_window_extent(renderer))
    placed = []
    for label, x, y in points:
        chosen = None
        for dx, dy, ha, ring in _candidates():
            line = {"arrowprops": LEADER} if ring >= 2 else {}         # far from its point: a line back to it
            note = ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va="bottom",
                               fontsize=fontsize, **line)
            box = text_box(note, renderer)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(other) for other in taken):
                chosen = note
                break
            note.remove()
        if chosen is None:                           # nowhere free: the farthest ring, a line back to the point
            chosen = ax.annotate(label, (x, y), xytext=(RINGS[-1][0], RINGS[-1][1] + 14 * len(placed) % 60),
                                 textcoords="offset points", fontsize=fontsize, va="bottom",
                                 arrowprops=LEADER)
        taken.append(text_box(chosen, renderer))
        placed.append(chosen)
    return placed


def label_boxes(ax) -> list:
    """The drawn boxes (display pixels) of the axes' annotations, for checks."""
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    return [text_box(text, renderer) for text in ax.texts]


def text_box(note, renderer):
    """The box of an annotation's text alone (its leader line may pass beside other labels)."""
    from matplotlib.text import Text

    note.update_positions(renderer)                  # where the text goes now, not where it was last drawn
    return Text.get_window_extent(note, renderer)
