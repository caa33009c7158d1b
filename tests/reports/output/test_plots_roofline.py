"""The roofline PNG reads as the text report does: labels that do not overlap, units on the axes, rings on
points above their roof, and no points at all when the report says the roofline is N/A."""

import sys

import numpy as np
import pytest
import torch

import reports
from reports.output.plots import plot_roofline
from reports.time.roofline import roofline
from tests import helpers
from tracer import Tracer

matplotlib = pytest.importorskip("matplotlib")
sys.path.insert(0, str(helpers.EXAMPLES))
import gpt  # noqa: E402

TRIAD = 20.4e9  # the README's measured CPU triad, bytes/s


@pytest.fixture(scope="module")
def gpt_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("roofline") / "gpt.parquet"
    torch.manual_seed(0)
    cfg = gpt.GPTConfig(n_layer=1)
    model = gpt.GPT(cfg)
    opt = gpt.make_optimizer(model)
    idx, targets = gpt.make_batch(cfg, 2)
    with Tracer(path, model=model, tokens=idx.numel()):
        gpt.train_step(model, opt, idx, targets)
    return reports.load(path)


def _labels(ax):
    return [t for t in ax.texts if isinstance(t, matplotlib.text.Annotation)]


def test_roofline_labels_do_not_overlap(gpt_trace):
    fig = plot_roofline(gpt_trace, bandwidth=TRIAD, labels=30)
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    boxes = [t.get_window_extent(renderer) for t in _labels(ax)]
    notes = [t.get_window_extent(renderer) for t in ax.texts if t.get_text().startswith("not labelled")]
    assert len(boxes) >= 10  # most names find a spot
    for i, a in enumerate(boxes + notes):
        assert not any(a.overlaps(b) for b in (boxes + notes)[i + 1 :]), a
        assert ax.get_window_extent(renderer).contains(a.x0, a.y0)
    drawn = roofline(gpt_trace, bandwidth=TRIAD).query(
        "flops_per_step > 0 and bytes_per_step > 0 and time_s_per_step > 0"
    )
    left_out = sum(
        len(t.get_text().split(": ", 1)[1].split(", ")) for t in ax.texts if t.get_text().startswith("not labelled")
    )
    assert len(boxes) + left_out == min(30, len(drawn))  # every name asked for is drawn or listed


def test_roofline_axes_have_units(gpt_trace):
    from matplotlib.ticker import EngFormatter

    (ax,) = plot_roofline(gpt_trace, bandwidth=TRIAD).axes
    assert "FLOP/B" in ax.get_xlabel() and "FLOP/s" in ax.get_ylabel()
    for axis, unit in ((ax.xaxis, "FLOP/B"), (ax.yaxis, "FLOP/s")):
        formatter = axis.get_major_formatter()
        assert isinstance(formatter, EngFormatter) and formatter.unit == unit
        assert formatter(1e9) == f"1 G{unit}"


def test_points_above_the_roof_are_ringed(gpt_trace):
    # a roof of 1 byte/s and 1 FLOP/s: every timed op kind is above it; a roof of 1e30: none is
    (ax,) = plot_roofline(gpt_trace, bandwidth=1.0, peak_flops=1.0).axes
    rings = [c for c in ax.collections if "above its roof" in str(c.get_label())]
    drawn = roofline(gpt_trace, bandwidth=1.0, peak_flops=1.0).query(
        "flops_per_step > 0 and bytes_per_step > 0 and time_s_per_step > 0"
    )
    assert len(rings) == 1 and len(rings[0].get_offsets()) == len(drawn) > 0
    (ax,) = plot_roofline(gpt_trace, bandwidth=1e30, peak_flops=1e30).axes
    assert not [c for c in ax.collections if "above its roof" in str(c.get_label())]


def test_no_roofline_points_without_a_roof(gpt_trace):
    assert "bandwidth" not in gpt_trace.attrs["runs"]["gpt"]  # no set_bandwidth on this CPU trace
    table = roofline(gpt_trace)
    assert table["efficiency"].isna().all() and set(table["bound"]) == {"other"}  # the text report's N/A
    (ax,) = plot_roofline(gpt_trace).axes
    assert not ax.collections and not ax.lines and not _labels(ax)  # no points, no roof
    assert "N/A" in ax.get_title() and any("no memory bandwidth" in t.get_text() for t in ax.texts)
    (ax,) = plot_roofline(gpt_trace, bandwidth=TRIAD).axes
    assert len(ax.collections) >= 2 and np.isfinite(roofline(gpt_trace, bandwidth=TRIAD)["efficiency"]).any()


def test_flops_axis_ticks_carry_the_unit(gpt_trace):
    from matplotlib.ticker import EngFormatter

    from reports.output.plots import plot_flops

    (ax,) = plot_flops(gpt_trace).axes
    formatter = ax.xaxis.get_major_formatter()
    assert isinstance(formatter, EngFormatter) and formatter(2.5e6) == "2.5 MFLOP"
    assert "FLOP" in ax.get_xlabel() and "per step" in ax.get_xlabel()
