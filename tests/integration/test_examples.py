"""The lecture's facts, asserted on traces of the example scripts, with the arithmetic."""

import json
import os

import gpt
import linear
import pytest
import tensors

from tests import helpers
from tests.helpers import forked

B, D, K = 1024, 256, 64  # the lecture's linear model: x [B, D] @ w [D, K]


def as_lists(column):
    """A list column of the trace as plain Python lists of ints."""
    return [[[int(n) for n in inner] for inner in outer] for outer in column]


# ------------------------------------------------------------------ linear model
@pytest.fixture(scope="module")
def linear_df(tmp_path_factory):
    return linear.trace_linear(tmp_path_factory.mktemp("linear") / "linear.parquet")


def test_linear_forward_is_2BDK(linear_df):
    mm = linear_df[(linear_df["flop_kind"] == "matmul") & (linear_df["phase"] == "forward")]
    assert mm["op"].tolist() == ["aten.mm.default"]
    assert as_lists(mm["input_shapes"]) == [[[1024, 256], [256, 64]]]
    assert mm["flops"].tolist() == [33554432]  # 2 * 1024 * 256 * 64
    assert mm["bytes_allocated"].tolist() == [262144]  # y is 1024 * 64 float32: 1024 * 64 * 4


def test_linear_backward_is_2BDK_when_x_needs_no_gradient(linear_df):
    mm = linear_df[(linear_df["flop_kind"] == "matmul") & (linear_df["phase"] == "backward")]
    # only dL/dw = x^T @ dL/dy: [256, 1024] @ [1024, 64] -> [256, 64]; dL/dx is never computed
    assert as_lists(mm["input_shapes"]) == [[[256, 1024], [1024, 64]]]
    assert as_lists(mm["output_shapes"]) == [[[256, 64]]]
    assert mm["flops"].tolist() == [33554432]  # 2 * 1024 * 256 * 64, not 4 * B * D * K


def test_linear_backward_is_4BDK_when_x_needs_a_gradient(tmp_path):
    df = linear.trace_linear(tmp_path / "xgrad.parquet", x_requires_grad=True)
    mm = df[(df["flop_kind"] == "matmul") & (df["phase"] == "backward")]
    # dL/dw = x^T @ dL/dy -> [256, 64] and dL/dx = dL/dy @ w^T -> [1024, 256]
    assert sorted(map(tuple, (s[0] for s in as_lists(mm["output_shapes"])))) == [(256, 64), (1024, 256)]
    assert mm["flops"].tolist() == [33554432, 33554432]
    assert mm["flops"].sum() == 67108864  # 4 * 1024 * 256 * 64


# ------------------------------------------------------------------ tensor storage
@pytest.fixture(scope="module")
def tensors_df(tmp_path_factory):
    return tensors.trace_tensors(tmp_path_factory.mktemp("tensors") / "tensors.parquet")


def line(df, name):
    rows = df[df["module"] == name]
    assert len(rows), f"no row for line {name!r}"
    return rows


@pytest.mark.parametrize(
    "name, dtype, nbytes",
    [
        ("zeros_float32", "float32", 128),  # 4 * 8 * 4
        ("zeros_float16", "float16", 64),  # 4 * 8 * 2
        ("zeros_bfloat16", "bfloat16", 64),  # 4 * 8 * 2
        ("zeros_float8_e4m3fn", "float8_e4m3fn", 32),  # 4 * 8 * 1
        ("zeros_float8_e5m2", "float8_e5m2", 32),  # 4 * 8 * 1
    ],
)
def test_bytes_per_element(tensors_df, name, dtype, nbytes):
    row = line(tensors_df, name)
    assert row["op"].tolist() == ["aten.zeros.default"]
    assert [list(d) for d in row["output_dtypes"]] == [[dtype]]
    assert row["bytes_allocated"].tolist() == [nbytes]
    assert row["bytes_written"].tolist() == [nbytes]


def x_storage(df):
    """The storage id of x = [[1, 2, 3], [4, 5, 6]], the input of every non-zeros line."""
    ids = {int(i) for ids in df.loc[~df["module"].str.startswith("zeros"), "input_storage_ids"] for i in ids[:1]}
    assert len(ids) == 1
    return ids.pop()


@pytest.mark.parametrize(
    "name, op, shape, stride",
    [
        ("row", "aten.select.int", [3], [1]),  # x[0]: the first 3 elements
        ("column", "aten.select.int", [2], [3]),  # x[:, 1]: every 3rd element from offset 1
        ("view", "aten.view.default", [3, 2], [2, 1]),  # x.view(3, 2)
        ("transpose", "aten.t.default", [3, 2], [1, 3]),  # x.t(): strides swapped, not contiguous
    ],
)
def test_views_share_storage_and_allocate_nothing(tensors_df, name, op, shape, stride):
    row = line(tensors_df, name)
    sid = x_storage(tensors_df)
    assert row["op"].tolist() == [op]
    assert row["is_view"].tolist() == [True]
    assert [list(ids) for ids in row["input_storage_ids"]] == [[sid]]
    assert [list(ids) for ids in row["output_storage_ids"]] == [[sid]]  # same storage as x
    assert as_lists(row["output_shapes"]) == [[shape]]
    assert as_lists(row["output_strides"]) == [[stride]]
    assert row["bytes_allocated"].tolist() == [0]
    assert row["bytes_written"].tolist() == [0]


def test_contiguous_copies(tensors_df):
    rows = line(tensors_df, "contiguous")
    sid = x_storage(tensors_df)
    # x.t() is a view; .contiguous() on it copies into a new storage with row-major strides
    assert rows["op"].tolist() == ["aten.t.default", "aten.clone.default"]
    assert rows["is_view"].tolist() == [True, False]
    assert rows["bytes_allocated"].tolist() == [0, 24]  # 3 * 2 * 4
    copy = rows.iloc[1]
    assert list(copy["input_storage_ids"]) == [sid]
    assert list(copy["output_storage_ids"]) != [sid]
    assert as_lists([copy["output_strides"]]) == [[[2, 1]]]


@pytest.mark.parametrize(
    "name, op",
    [
        ("pow", "aten.pow.Tensor_Scalar"),
        ("sqrt", "aten.sqrt.default"),
        ("add", "aten.add.Tensor"),
        ("triu", "aten.triu.default"),
    ],
)
def test_elementwise_ops_allocate(tensors_df, name, op):
    row = line(tensors_df, name)
    sid = x_storage(tensors_df)
    assert row["op"].tolist() == [op]
    assert row["is_view"].tolist() == [False]
    assert sid not in {int(i) for ids in row["output_storage_ids"] for i in ids}
    assert row["bytes_allocated"].tolist() == [24]  # 2 * 3 * 4


def test_every_allocation_has_its_own_storage(tensors_df):
    allocating = tensors_df[tensors_df["bytes_allocated"] > 0]
    sids = [int(ids[0]) for ids in allocating["output_storage_ids"]]
    assert len(sids) == len(set(sids)) == 10  # 5 zeros, 1 copy, 4 elementwise
    # every output is kept alive, so the live bytes at the end are all of them, plus x
    # (made before the trace, seen from its first use): zeros 128 + 64 + 64 + 32 + 32,
    # x 24, the copy and 4 elementwise results 5 * 24: 320 + 24 + 120 = 464
    assert tensors_df["bytes_allocated"].sum() == 440  # 320 + 120
    assert tensors_df["live_bytes"].iloc[-1] == 464


# ------------------------------------------------------------------ the scripts themselves
@pytest.mark.parametrize(
    "script, expected",
    [
        ("linear.py", ["33,554,432", "67,108,864", "2 * B*D*K", "4 * B*D*K"]),
        ("tensors.py", ["zeros_float8_e5m2", "aten.clone.default", "128 B in float32"]),
        (
            "gpt.py",
            [
                "3 step(s)",
                "2·N·T",
                "4·N·T",
                "6·N·T",
                "Top 8 ops by FLOPs",
                "Memory: peak",
                "MFU",
                "Roofline",
                "compute-bound",
                "memory-bound",
            ],
        ),
        # rank 0 of 64, 4 blocks of 12,584,960 bf16 parameters (qkv 3 * 2**20, proj 2**20, mlp 2 * 4 * 2**20,
        # 2 norms 1024) and a root unit of 67,634,176 (2 embeddings of 32,000 x 1024, wpe 2048 x 1024, ln_f):
        # 9 all-gathers of (67,634,176 + 8 * 12,584,960) * 2 bytes = 336,627,712 = 321 MiB, of which 63/64 = 316 MiB
        # sent; 5 fp32 reduce-scatters of (67,634,176 + 4 * 12,584,960) * 4 = 471,896,064 = 450 MiB, 443 MiB sent
        (
            "simulate.py",
            [
                "Distributed: rank 0 of world size 64 (backend fake; 1 of 64 ranks present in the trace)",
                "reduce_scatter 0 (64)     5 450 MiB 443 MiB  443 MiB",
                "all_gather 0 (64)     9 321 MiB 316 MiB  316 MiB",
            ],
        ),
    ],
)
def test_example_script_runs(scripts_run, script, expected):
    """`python examples/<script>` as `make demo` runs it: default arguments, runs/ not there yet."""
    results, cwd = scripts_run
    result = results[script]
    assert result["code"] == 0, result["stderr"]
    for text in expected:
        assert text in result["stdout"], f"{text!r} not in the output of {script}:\n{result['stdout']}"
    assert (cwd / script / "runs" / script.replace(".py", ".parquet")).is_dir()


# The 4 scripts of test_example_script_runs in one child process (one torch import, not one per script: 5 CPU-s less);
# simulate.py last: its fake process group is the process's from then on.
SCRIPTS = ("linear.py", "tensors.py", "gpt.py", "simulate.py")


@pytest.fixture(scope="module")
def scripts_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("scripts")
    return helpers.run_examples(cwd, *((name, []) for name in SCRIPTS)), cwd


def test_gpt_main_sdpa_bf16(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    gpt.main(["--steps", "1", "--attention", "sdpa", "--dtype", "bf16"])
    assert os.listdir(tmp_path / "runs") == ["gpt-sdpa-bf16-s1.parquet"]  # the options that differ from the defaults
    out = capsys.readouterr().out
    assert "1 step(s)" in out
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in out
    assert "N = 131,072 parameters (matmul)" in out  # 2 * 12 * 64 * 64 + 512 * 64: the weights' bf16 copies count


def test_gpt_main_export(tmp_path, capsys):
    """`make demo` passes --export: the report, then the trace as Chrome JSON."""
    gpt.main(["--out", str(tmp_path / "gpt.parquet"), "--steps", "1", "--export", str(tmp_path / "gpt.json")])
    assert "optrace export:" in capsys.readouterr().out
    from reports import load

    events = json.loads((tmp_path / "gpt.json").read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == len(load(tmp_path / "gpt.parquet"))


# ------------------------------------------------------------------ --help, and where each run writes
EXAMPLES = sorted(p.name for p in (helpers.EXAMPLES).glob("*.py"))
# Every example's `--help` in one child process (one torch import, not one per script): each script run as
# `python examples/<script> --help` runs it, from an empty directory of its own named as the script; what it printed,
# its exit status or exception.
HELP_ALL = """
import contextlib, io, json, os, runpy, sys
results, base = {}, os.getcwd()
for script in sys.argv[1:]:
    os.mkdir(os.path.join(base, os.path.basename(script)))
    os.chdir(os.path.join(base, os.path.basename(script)))
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [script, "--help"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name="__main__")
            code = "returned without exiting"
        except SystemExit as exc:
            code = exc.code or 0
        except BaseException as exc:
            code = f"{type(exc).__name__}: {exc}"
    results[script] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()[-2000:]}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def helps(examples_dir, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("help")
    done = forked.run(
        HELP_ALL,
        [examples_dir / name for name in EXAMPLES],
        cwd=cwd,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(examples_dir.parent)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1]), cwd


@pytest.mark.parametrize("script", EXAMPLES)
def test_every_example_prints_its_usage_and_runs_nothing(helps, script):
    """`--help` exits 0 with the usage; compare_precision.py ran both traces, distributed.py raised (no RANK)."""
    results, cwd = helps
    result = next(r for name, r in results.items() if name.endswith("/" + script))
    assert result["code"] == 0, result
    assert result["stdout"].startswith(f"usage: {script} "), result
    assert list((cwd / script).iterdir()) == []  # no runs/ made, no trace written


def test_distributed_outside_torchrun_is_one_line(examples_dir, tmp_path):
    done = forked.run(
        script=examples_dir / "distributed.py",
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(examples_dir.parent)},
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        "distributed.py: error: no process group to join (RANK is not set): run it "
        "under torchrun, e.g. torchrun --nproc_per_node=2 examples/distributed.py"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, out",
    [
        ([], "runs/llama-8b-w8-b1.parquet"),
        (["--batch", "2", "--checkpoint"], "runs/llama-8b-w8-b2-ck.parquet"),  # the README's worked example
        (["--model", "tiny", "--world", "64", "--seq", "16"], "runs/llama-tiny-w64-b1-s16.parquet"),
    ],
)
def test_plan_llama_default_path_names_the_run(monkeypatch, tmp_path, argv, out):
    """Before, every run of one model and world wrote runs/llama-8b-w8.parquet, whatever its batch or checkpointing."""
    import plan_llama

    traced, planned = [], []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(plan_llama, "trace", lambda path, cfg, world, batch, checkpoint: traced.append(path))
    monkeypatch.setattr(plan_llama, "optrace", lambda argv: planned.append(argv) or 0)
    assert plan_llama.main(argv) == 0
    assert traced == [out] and planned[0][:2] == ["plan", out]
    assert (tmp_path / "runs").is_dir()


@pytest.mark.parametrize(
    "argv, out",
    [
        ([], "runs/simulate.parquet"),
        (["--world", "8", "--layers", "2", "--checkpoint"], "runs/simulate-w8-l2-ck.parquet"),
        (["--world", "16", "--tp", "8"], "runs/simulate-w16-tp8.parquet"),
        (["--world", "16", "--tp", "8", "--no-sequence-parallel"], "runs/simulate-w16-tp8-nosp.parquet"),
        (
            ["--d-model", "256", "--heads", "4", "--seq", "128", "--batch", "2", "--vocab", "1000"],
            "runs/simulate-d256-h4-s128-b2-v1000.parquet",
        ),
    ],
)
def test_simulate_default_path_names_the_run(monkeypatch, tmp_path, argv, out):
    import simulate as script

    traced = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(script, "simulate", lambda path, *args, **kwargs: traced.append(path))
    monkeypatch.setattr(script, "optrace", lambda argv: 0)
    assert script.main(argv) == 0
    assert traced == [out]


@pytest.mark.parametrize(
    "argv, error",
    [
        (["--world", "8", "--tp", "3"], "--tp 3 must divide --world 8 and --heads 16"),
        (["--world", "8", "--tp", "8", "--heads", "4"], "--tp 8 must divide --world 8 and --heads 4"),
        (["--tp", "0"], "--tp 0 must divide --world 64 and --heads 16"),
    ],
)
def test_simulate_refuses_a_tp_degree_in_one_line(monkeypatch, tmp_path, capsys, argv, error):
    """A TP degree that divides not the world or the heads: a ValueError's traceback from simulate() (after
    the fake process group was made), now argparse's error before anything runs."""
    import simulate as script

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(script, "simulate", lambda path, *args, **kwargs: None)
    monkeypatch.setattr(script, "optrace", lambda argv: 0)
    with pytest.raises(SystemExit) as stopped:
        script.main(argv)
    assert stopped.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(error)
