"""reports.plots: the figures are drawn, written as PNGs that open, and matplotlib stays optional."""

import subprocess
import sys

import pytest
import torch
from torch import nn

from reports.errors import ReportError
from reports.loading.load import load
from reports.output.plots import plot_compare, plot_flops, plot_memory, save_plots
from tests import helpers
from tracer import Tracer

matplotlib = pytest.importorskip("matplotlib")


def trace(path, run_name, dtype=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    with Tracer(path, model=model, run_name=run_name):
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
                loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("plots")
    return load([trace(d / "fp32.parquet", "fp32"), trace(d / "bf16.parquet", "bf16", torch.bfloat16)])


def test_figures(runs):
    from matplotlib.figure import Figure

    for plot in (plot_flops, plot_memory, plot_compare):
        fig = plot(runs)
        assert isinstance(fig, Figure)
        labels = [ax.get_xlabel() + ax.get_ylabel() for ax in fig.axes]
        assert any("FLOPs" in text or "B)" in text for text in labels), labels  # units on an axis


def test_memory_marks_the_peak(runs):
    fig = plot_memory(runs)
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert sum(note.startswith("peak ") for note in notes) == 2  # one per run


def test_save_plots_writes_pngs(runs, tmp_path):
    from matplotlib.image import imread

    paths = save_plots(runs, tmp_path / "plots")
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["flops.png", "memory.png", "roofline.png", "compare.png"]
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1024
        image = imread(path)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    one = runs[runs["run"] == "fp32"].copy()
    one.attrs["runs"] = {"fp32": runs.attrs["runs"]["fp32"]}
    assert len(save_plots(one, tmp_path / "one")) == 3  # no compare.png for a single run


def test_matplotlib_missing(runs, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    for plot in (plot_flops, plot_memory, plot_compare):
        with pytest.raises(
            ReportError, match=r"plots need matplotlib, which is not installed: pip install optrace\[plot\]"
        ):
            plot(runs)


def test_errors(runs, tmp_path):
    with pytest.raises(ReportError, match=r"plots: the trace has no rows to plot"):
        plot_memory(runs.iloc[0:0])
    with pytest.raises(ReportError, match=r"plot_flops: the trace lacks column\(s\) \['flops'\]"):
        plot_flops(runs.drop(columns="flops"))
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ReportError, match=r"save_plots: cannot create directory '.*file/plots'"):
        save_plots(runs, blocker / "plots")


def test_public_names_import_without_torch_or_matplotlib():
    code = (
        "import importlib, sys\n"
        "for name in ('reports.memory.memory', 'reports.memory.views', 'reports.compare', 'reports.output.plots'):\n"
        "    module = importlib.import_module(name)\n"
        "    assert all(hasattr(module, n) for n in module.__all__), name\n"
        "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=helpers.ROOT, check=True)
