"""What the plots share: a Figure on the Agg canvas, the runs a trace plots, engineering tick labels.

matplotlib is imported inside the functions: importing reports.output.plots does not import it.
"""

from reports.errors import ReportError
from reports.loading.load import runs_of


def figure(width, height):
    """A Figure on the Agg canvas, or ReportError when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError("plots need matplotlib, which is not installed: pip install optrace[plot]") from None
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def plotted_runs(df):
    runs = list(runs_of(df))
    if not len(df):
        raise ReportError("plots: the trace has no rows to plot")
    return runs


def eng_formatter(unit):
    """matplotlib's EngFormatter: SI prefixes (k, M, G) with the unit on every tick label."""
    from matplotlib.ticker import EngFormatter

    return EngFormatter(unit=unit)
