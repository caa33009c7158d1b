"""Plots of a loaded trace: FLOPs by module and phase, memory over the step, runs side by side.

matplotlib is optional (`pip install optrace[plot]`). The figures are plain
`matplotlib.figure.Figure` objects drawn on the Agg canvas: nothing touches
pyplot's global state or the interactive backend.
"""

import os

import numpy as np
import pandas as pd

from reports.errors import ReportError
from reports.loading.load import runs_of
from tracer.schema import PHASES

__all__ = ["plot_compare", "plot_flops", "plot_memory", "plot_roofline", "save_plots"]

_PHASE_COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "optimizer": "#55A868", "other": "#8C8C8C"}
_CATEGORY_COLORS = {
    "parameters": "#4C72B0",
    "unsharded_parameters": "#8FAADC",
    "gradients": "#DD8452",
    "optimizer_state": "#55A868",
    "communication_buffers": "#64B5CD",
    "activations": "#C44E52",
    "inputs": "#8172B3",
    "temporaries": "#CCB974",
}


def _figure(width, height):
    """A Figure on the Agg canvas, or ReportError when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError("plots need matplotlib, which is not installed: pip install optrace[plot]") from None
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _scale(values, binary):
    """(divisor, prefix) that brings the largest value into 1..1000 (1..1024 for bytes)."""
    top = float(np.nanmax(np.abs(values))) if len(values) else 0.0
    steps = (
        ((2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki"))
        if binary
        else ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
    )
    for factor, prefix in steps:
        if top >= factor:
            return factor, prefix
    return 1, ""


def _runs(df):
    runs = list(runs_of(df))
    if not len(df):
        raise ReportError("plots: the trace has no rows to plot")
    return runs


def plot_flops(df, top=15):
    """FLOPs per step by innermost module, stacked by phase: one panel per run, the `top` modules by FLOPs."""
    from reports.loading.load import require
    from reports.steps import per_step

    require(df, ("step", "phase", "module", "flops"), "plot_flops")
    runs = _runs(df)
    tables = []
    for run in runs:
        rows = df[df["run"] == run]
        phase = rows["phase"].astype(object)
        table = pd.DataFrame({p: per_step(rows, mask=phase == p, by="module") for p in PHASES if (phase == p).any()})
        table = table.fillna(0.0)
        table.index = [name or "(outside any module)" for name in table.index]
        order = table.sum(axis=1).sort_values(ascending=False)
        if len(order) > top:
            rest = table.loc[order.index[top:]].sum()
            table = table.loc[order.index[:top]]
            table.loc[f"({len(order) - top} more modules)"] = rest
        else:
            table = table.loc[order.index]
        tables.append(table)
    height = sum(1.2 + 0.32 * len(t) for t in tables)
    fig = _figure(10, max(3.0, height))
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    for ax, run, table in zip(axes, runs, tables):
        y = np.arange(len(table))
        left = np.zeros(len(table))
        for phase in table.columns:
            values = table[phase].to_numpy(dtype=float)
            ax.barh(y, values, left=left, color=_PHASE_COLORS.get(phase), label=phase)
            left += values
        ax.set_yticks(y, table.index, fontsize=9)
        ax.invert_yaxis()
        ax.xaxis.set_major_formatter(_eng_formatter("FLOP"))
        ax.set_xlabel("FLOPs per step (FLOP, 2 per multiply-add)")
        ax.set_title(f"{run}: FLOPs by module (innermost) and phase")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(loc="lower right", fontsize=9)
    return fig


def _thin(live, points):
    """Row positions to draw: all of them, or per bin of rows the one with the most live bytes (peaks survive)."""
    n = len(live)
    if n <= 2 * points:
        return np.arange(n)
    bins = np.arange(n) * points // n
    order = np.lexsort((-live, bins))
    first = np.r_[True, bins[order][1:] != bins[order][:-1]]
    return np.sort(order[first])


def _phase_band(ax, seq, phase, step, top):
    """The phases as coloured spans along the top of the panel, labelled where there is room."""
    change = np.flatnonzero((phase[1:] != phase[:-1]) | (step[1:] != step[:-1])) + 1
    starts, ends = np.r_[0, change], np.r_[change, len(seq)]
    left, width = seq[starts], seq[ends - 1] + 1 - seq[starts]
    span = seq[-1] + 1 - seq[0]
    for name in dict.fromkeys(phase[starts]):
        pick = phase[starts] == name
        ax.broken_barh(
            list(zip(left[pick], width[pick])),
            (top * 0.93, top * 0.07),
            color=_PHASE_COLORS.get(name, "#8C8C8C"),
            linewidth=0,
        )
    if len(starts) > 60:
        return
    for a, x, w in zip(starts, left, width):
        for label in (f"{phase[a]} (step {step[a]})", str(phase[a])):
            if w > 0.0085 * len(label) * span:  # room for the label at 8 pt on an 11-inch figure
                ax.text(x + w / 2, top * 0.965, label, ha="center", va="center", fontsize=8, color="white")
                break


def plot_memory(df, points=5000):
    """Live bytes after every op, split into memory categories (stacked), the phases along the top, the peak marked.

    Runs longer than 2 x `points` ops are drawn with, per bin of ops, the op with the most live bytes."""
    from reports.memory.memory import CATEGORIES, timeline

    runs = _runs(df)
    line = timeline(df)
    fig = _figure(11, 4.2 * len(runs))
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    factor, prefix = _scale(line["live_bytes"].to_numpy(dtype=float), binary=True)
    for ax, run in zip(axes, runs):
        rows = line[line["run"] == run]
        all_seq = rows["seq"].to_numpy()
        if not len(rows):
            ax.set_title(f"{run}: no ops")
            continue
        live_all = rows["live_bytes"].to_numpy(dtype=float) / factor
        shown = rows.iloc[_thin(live_all, points)]
        seq = shown["seq"].to_numpy()
        stacks = [shown[f"{c}_bytes"].to_numpy(dtype=float) / factor for c in CATEGORIES]
        ax.stackplot(
            seq,
            *stacks,
            labels=[c.replace("_", " ") for c in CATEGORIES],
            colors=[_CATEGORY_COLORS[c] for c in CATEGORIES],
            step="post",
            alpha=0.85,
        )
        live = shown["live_bytes"].to_numpy(dtype=float) / factor
        ax.step(seq, live, where="post", color="black", linewidth=0.8, label="live bytes")
        top = live_all.max() * 1.12 or 1.0
        _phase_band(ax, all_seq, rows["phase"].to_numpy(dtype=object), rows["step"].to_numpy(), top)
        at = int(np.argmax(live_all))
        ax.plot(all_seq[at], live_all[at], marker="v", color="red", markersize=9, zorder=5)
        ax.annotate(
            f"peak {live_all[at]:.3g} {prefix}B after op {all_seq[at]}\n({rows['phase'].iloc[at]})",
            xy=(all_seq[at], live_all[at]),
            xytext=(0.02, 0.80),
            textcoords="axes fraction",
            fontsize=9,
            arrowprops={"arrowstyle": "->", "color": "red"},
            color="red",
        )
        ax.set_ylim(0, top)
        ax.set_xlim(all_seq[0], all_seq[-1] + 1)
        ax.set_xlabel("op (seq)")
        ax.set_ylabel(f"live memory ({prefix}B)")
        ax.set_title(f"{run}: live memory by category")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    return fig


def plot_compare(df):
    """Bars per run: FLOPs per step and bytes allocated per step (stacked by phase), peak memory by category."""
    from reports.loading.load import require
    from reports.memory.memory import CATEGORIES, by_category
    from reports.steps import per_step

    require(df, ("step", "phase", "flops", "bytes_allocated"), "plot_compare")
    runs = _runs(df)
    per_phase = {}
    for run in runs:
        rows = df[df["run"] == run]
        phase = rows["phase"].astype(object)
        per_phase[run] = pd.DataFrame({c: per_step(rows, values=c, by=phase) for c in ("flops", "bytes_allocated")})
    cats = by_category(df, at="peak")
    fig = _figure(max(12, 1.2 * len(runs) * 3), 5)
    axes = fig.subplots(1, 3)
    x = np.arange(len(runs))
    width = 0.6
    for ax, column, binary, title in (
        (axes[0], "flops", False, "FLOPs per step"),
        (axes[1], "bytes_allocated", True, "bytes allocated per step"),
    ):
        factor, prefix = _scale(np.array([per_phase[r][column].sum() for r in runs], dtype=float), binary)
        bottom = np.zeros(len(runs))
        for phase in PHASES:
            values = np.array([per_phase[r][column].get(phase, 0) for r in runs], dtype=float) / factor
            if values.any():
                ax.bar(x, values, width, bottom=bottom, color=_PHASE_COLORS[phase], label=phase)
                bottom += values
        ax.set_ylabel(f"{title} ({prefix}{'B' if binary else 'FLOPs'})")
        ax.set_title(title)
    ax = axes[2]
    totals = cats.groupby("run", sort=False)["bytes"].sum()
    factor, prefix = _scale(totals.to_numpy(dtype=float), binary=True)
    bottom = np.zeros(len(runs))
    for category in CATEGORIES:
        values = (
            np.array([cats.loc[(cats["run"] == r) & (cats["category"] == category), "bytes"].sum() for r in runs])
            / factor
        )
        if values.any():
            ax.bar(x, values, width, bottom=bottom, color=_CATEGORY_COLORS[category], label=category.replace("_", " "))
            bottom += values
    ax.set_ylabel(f"peak live memory ({prefix}B)")
    ax.set_title("peak live memory by category")
    for ax in axes:
        ax.set_xticks(x, runs, rotation=20 if max(len(r) for r in runs) > 8 else 0)
        ax.set_xlabel("run")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    return fig


_BOUND_COLORS = {"compute": "#4C72B0", "memory": "#C44E52", "other": "#8C8C8C"}
# label positions tried around a point, in points from it: right, above, left, below, then the diagonals, farther out
_OFFSETS = [
    (dx * r, dy * r)
    for r in (5, 14, 26)
    for dx, dy in ((1, 0.6), (1, -1.6), (-1, 0.6), (-1, -1.6), (0, 1.2), (0, -2.2))
]


def _eng(ax, x_unit, y_unit):
    """Engineering tick labels with units on both axes (1 k, 10 M FLOP/s...)."""
    ax.xaxis.set_major_formatter(_eng_formatter(x_unit))
    ax.yaxis.set_major_formatter(_eng_formatter(y_unit))


def _eng_formatter(unit):
    """matplotlib's EngFormatter: SI prefixes (k, M, G) with the unit on every tick label."""
    from matplotlib.ticker import EngFormatter

    return EngFormatter(unit=unit)


def _place_labels(ax, points, names):
    """Label points without overlaps: each name tries the offsets in turn and takes the first spot whose box
    overlaps no label placed before, no other point's centre, and lies inside the axes; names with no free
    spot are returned (the caller lists them). The figure's layout is fixed before measuring."""
    fig = ax.figure
    fig.draw_without_rendering()  # run the constrained layout now, so the boxes measured below stay put
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    centres = ax.transData.transform(points) if len(points) else np.zeros((0, 2))
    note = _note(ax, names)  # the spot of the list of names left out, reserved at its longest
    placed, skipped = [note.get_window_extent(renderer)], []
    note.remove()
    for i, name in enumerate(names):
        for dx, dy in _OFFSETS:
            text = ax.annotate(
                name,
                points[i],
                xytext=(dx, dy),
                textcoords="offset points",
                fontsize=8,
                ha="left" if dx >= 0 else "right",
                va="bottom" if dy >= 0 else "top",
            )
            text.set_in_layout(False)
            box = text.get_window_extent(renderer)
            others = np.delete(centres, i, axis=0)
            inside = (
                (others[:, 0] >= box.x0)
                & (others[:, 0] <= box.x1)
                & (others[:, 1] >= box.y0)
                & (others[:, 1] <= box.y1)
            )
            free = not any(box.overlaps(b) for b in placed) and not inside.any()
            if free and frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1):
                placed.append(box)
                break
            text.remove()
        else:
            skipped.append(name)
    if skipped:
        _note(ax, skipped)
    return skipped


def _note(ax, names):
    text = ax.text(
        0.01,
        0.99,
        "not labelled (no room): " + ", ".join(names),
        transform=ax.transAxes,
        fontsize=7,
        va="top",
        ha="left",
        color="#555555",
    )
    text.set_in_layout(False)
    return text


def _not_available(ax, run, why):
    """An explicit N/A panel: no points, no roof, the reason in words (as the text report says N/A)."""
    ax.set_axis_off()
    ax.set_title(f"{run}: roofline N/A", fontsize=10)
    ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True, fontsize=10, transform=ax.transAxes)


def plot_roofline(df, by="op", peak_flops=None, bandwidth=None, labels=8):
    """Log-log roofline per run: op kinds as points (area by their time) at their arithmetic
    intensity and achieved FLOP/s, under the memory roof (intensity x bandwidth) and the compute
    roof of each dtype present. The `labels` op kinds with the most time are named where their
    name fits without overlapping another (the others are listed under the plot).

    Op kinds without FLOPs or bytes (copies, views) cannot sit on log axes; the title says
    how much time they took. A point above its roof (small tensors that stay in cache: the roof
    is DRAM bandwidth) is ringed and the legend says so. A run without a memory bandwidth or a
    peak has no roof, and the text report says N/A: its panel says N/A and draws no points."""
    from reports.time.roofline import roofline

    runs = _runs(df)
    table = roofline(df, by=by, peak_flops=peak_flops, bandwidth=bandwidth)
    if "run" not in table.columns:
        table = table.assign(run=runs[0])
    fig = _figure(10, 6 * len(runs))
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    pending = []
    for ax, run in zip(axes, runs):
        t = table[table["run"] == run]
        bw = t["peak_bytes_per_s"].dropna()
        peaks = t.dropna(subset=["peak_flops_per_s"]).groupby("dtype")["peak_flops_per_s"].first()
        if not len(bw) or not len(peaks):
            missing = " and ".join(
                w for w, gone in (("memory bandwidth", not len(bw)), ("peak FLOP/s", not len(peaks))) if gone
            )
            _not_available(
                ax,
                run,
                f"no roof: the trace records no {missing}\n(Tracer.set_bandwidth(tracer.memory_bandwidth()), "
                "a known device, or peak_flops= / bandwidth=)",
            )
            continue
        drawn = t[(t["flops_per_step"] > 0) & (t["bytes_per_step"] > 0) & (t["time_s_per_step"] > 0)]
        hidden = t.drop(drawn.index)
        x, y = drawn["arithmetic_intensity"].to_numpy(float), drawn["achieved_flops_per_s"].to_numpy(float)
        share = drawn["time_s_per_step"].to_numpy(float) / max(t["time_s_per_step"].sum(), 1e-30)
        lo = min(x.min() / 3 if len(x) else 0.01, 0.01)
        hi = max(x.max() * 3 if len(x) else 1000, 1000)
        grid = np.geomspace(lo, hi, 200)
        band, top = float(bw.iloc[0]), [float(p) for p in peaks]
        ax.plot(
            grid,
            np.minimum(grid * band, max(top)),
            color="black",
            linewidth=1.2,
            label=f"memory roof {band / 1e9:.3g} GB/s",
        )
        for dtype, peak in peaks.items():
            ax.plot(
                grid,
                np.minimum(peak, grid * band),
                linestyle="--",
                linewidth=1.2,
                label=f"{dtype} peak {_eng_formatter('FLOP/s')(peak)}",
            )
        for bound, color in _BOUND_COLORS.items():
            pick = (drawn["bound"] == bound).to_numpy()
            if pick.any():
                ax.scatter(
                    x[pick],
                    y[pick],
                    s=20 + 2000 * share[pick],
                    color=color,
                    alpha=0.6,
                    edgecolor="black",
                    linewidth=0.5,
                    label=f"{bound}-bound op kinds",
                )
        above = y > drawn["attainable_flops_per_s"].to_numpy(float) * (1 + 1e-9)
        if above.any():
            ax.scatter(
                x[above],
                y[above],
                s=40 + 2000 * share[above],
                facecolor="none",
                edgecolor="#D62728",
                linewidth=1.5,
                label="above its roof: data cache-resident (roofs are DRAM)",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ymax = max([*top, *(y if len(y) else [1.0])]) * 3
        ax.set_ylim(max(min(y.min() / 3 if len(y) else 1.0, ymax / 1e6), 1.0), ymax)
        _eng(ax, "FLOP/B", "FLOP/s")
        ax.set_xlabel("arithmetic intensity (FLOPs per algorithmic byte, FLOP/B)")
        ax.set_ylabel("achieved FLOP/s (FLOPs per second of op time)")
        hidden_pct = 100 * hidden["time_s_per_step"].sum() / max(t["time_s_per_step"].sum(), 1e-30)
        ax.set_title(
            f"{run}: roofline by {by} (area: share of op time; {len(hidden)} kinds without FLOPs, "
            f"{hidden_pct:.0f}% of time, not drawn)",
            fontsize=10,
        )
        ax.grid(which="both", alpha=0.25)
        ax.legend(loc="lower right", fontsize=8)
        order = np.argsort(-share, kind="stable")[:labels]
        key = drawn.columns[0] if by != "op" else "op"
        names = [str(drawn.iloc[i][key]).removeprefix("aten.") for i in order]
        pending.append((ax, np.column_stack([x, y])[order] if len(order) else np.zeros((0, 2)), names))
    for ax, points, names in pending:  # after every panel is drawn: the layout no longer moves
        _place_labels(ax, points, names)
    return fig


def save_plots(df, directory):
    """Write flops.png, memory.png, roofline.png and (with several runs) compare.png into `directory`; return their paths."""
    directory = os.fspath(directory)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"save_plots: cannot create directory {directory!r} ({exc})") from None
    figures = [("flops.png", plot_flops), ("memory.png", plot_memory), ("roofline.png", plot_roofline)]
    if len(runs_of(df)) > 1:
        figures.append(("compare.png", plot_compare))
    paths = []
    for name, plot in figures:
        path = os.path.join(directory, name)
        plot(df).savefig(path, dpi=110)
        paths.append(path)
    return paths
