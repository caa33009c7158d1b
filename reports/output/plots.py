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
from reports.output.figures import eng_formatter, figure, plotted_runs
from reports.output.plots_roofline import plot_roofline
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


def plot_flops(df, top=15):
    """FLOPs per step by innermost module, stacked by phase: one panel per run, the `top` modules by FLOPs."""
    from reports.loading.load import require
    from reports.steps import per_step

    require(df, ("step", "phase", "module", "flops"), "plot_flops")
    runs = plotted_runs(df)
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
    fig = figure(10, max(3.0, height))
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
        ax.xaxis.set_major_formatter(eng_formatter("FLOP"))
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

    runs = plotted_runs(df)
    line = timeline(df)
    fig = figure(11, 4.2 * len(runs))
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
    runs = plotted_runs(df)
    per_phase = {}
    for run in runs:
        rows = df[df["run"] == run]
        phase = rows["phase"].astype(object)
        per_phase[run] = pd.DataFrame({c: per_step(rows, values=c, by=phase) for c in ("flops", "bytes_allocated")})
    cats = by_category(df, at="peak")
    fig = figure(max(12, 1.2 * len(runs) * 3), 5)
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
