"""The pictures a person looks at: scatter labels that do not cover each other, whole-number ticks."""

import itertools
import struct

import pytest

pytest.importorskip("matplotlib")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fastdllm.bench.analyze_report import integer_ticks, sweep_figure  # noqa: E402
from fastdllm.bench.format_html import scatter_png  # noqa: E402
from fastdllm.bench.plot_labels import label_boxes, place_labels  # noqa: E402

pytestmark = pytest.mark.fast

# analyze's sweep as the issue met it: rules at nearly the same NFE and agreement crowd one corner
CROWDED = [{"rule": rule, "value": value, "nfe": nfe, "agreement": agreement}
           for rule, value, nfe, agreement in [("threshold", 0.7, 20, 0.91), ("threshold", 0.8, 21, 0.93),
                                               ("threshold", 0.9, 22, 0.95), ("threshold", 0.95, 23, 0.96),
                                               ("factor", 0.5, 21, 0.94), ("factor", 1.0, 20, 0.92),
                                               ("cache", "prefix", 22, 0.95), ("cache", "dual", 23, 0.94),
                                               ("cache", "none", 64, 1.0)]]


def _assert_readable(fig, ax, n):
    boxes = label_boxes(ax)
    assert len(boxes) == n
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    frame = ax.get_window_extent(fig.canvas.get_renderer())
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)
    assert all(t.get_fontsize() >= 8 for t in ax.texts)


def test_analyze_sweep_labels_do_not_overlap_and_stay_in_the_axes():
    fig = sweep_figure(plt, CROWDED)
    try:
        _assert_readable(fig, fig.axes[0], len(CROWDED))
    finally:
        plt.close(fig)


def test_labels_avoid_points_and_each_other_at_the_same_spot():
    fig, ax = plt.subplots(figsize=(5, 3.5))
    points = [(f"label {i}", 1.0 + 0.01 * i, 1.0) for i in range(6)] + [("far", 3.0, 2.0)]
    ax.scatter([x for _, x, _ in points], [y for _, _, y in points])
    ax.margins(0.3)
    fig.tight_layout()
    try:
        place_labels(ax, points)
        _assert_readable(fig, ax, len(points))
    finally:
        plt.close(fig)


def test_integer_axes_get_only_whole_number_ticks():
    fig, ax = plt.subplots()
    ax.scatter([1, 2, 3, 4], [0.2, 0.5, 0.7, 0.9])
    integer_ticks(ax, "x")
    fig.canvas.draw()
    try:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks)
    finally:
        plt.close(fig)


def test_the_bench_page_scatter_is_drawn_at_a_readable_size():
    png = scatter_png([(f"threshold 0.{i}", 0.9 + i / 100, 2 + i / 10) for i in range(5, 10)], "speed")
    width, height = struct.unpack(">II", png[16:24])          # the PNG header's IHDR
    assert width >= 700 and height >= 450
