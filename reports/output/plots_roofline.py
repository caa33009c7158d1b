"""The roofline plot (reports.output.plots.plot_roofline): op kinds at their arithmetic intensity and achieved
FLOP/s under the memory and compute roofs, named where the name fits."""

import numpy as np

from reports.output.figures import eng_formatter, figure, plotted_runs

_BOUND_COLORS = {"compute": "#4C72B0", "memory": "#C44E52", "other": "#8C8C8C"}
# label positions tried around a point, in points from it: right, above, left, below, then the diagonals, farther out
_OFFSETS = [
    (dx * r, dy * r)
    for r in (5, 14, 26)
    for dx, dy in ((1, 0.6), (1, -1.6), (-1, 0.6), (-1, -1.6), (0, 1.2), (0, -2.2))
]


def _eng(ax, x_unit, y_unit):
    """Engineering tick labels with units on both axes (1 k, 10 M FLOP/s...)."""
    ax.xaxis.set_major_formatter(eng_formatter(x_unit))
    ax.yaxis.set_major_formatter(eng_formatter(y_unit))


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

    runs = plotted_runs(df)
    table = roofline(df, by=by, peak_flops=peak_flops, bandwidth=bandwidth)
    if "run" not in table.columns:
        table = table.assign(run=runs[0])
    fig = figure(10, 6 * len(runs))
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
                label=f"{dtype} peak {eng_formatter('FLOP/s')(peak)}",
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
