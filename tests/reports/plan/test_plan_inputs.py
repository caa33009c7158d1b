"""What reports.plan reads from a trace and its inputs: what the optimizer makes, the traced batch, an
incomplete trace, a trace without model=, assumptions out of range, allowances, steady steps.

AdamW below is one bias-free fp32 Linear(1024, 1024) on the meta device, x [batch, 1024],
`model(x).sum().backward(); opt.step(); opt.zero_grad()` with AdamW(foreach=True): weight,
gradient, exp_avg, exp_avg_sq and each of the foreach temporaries 1024^2 x 4 = 4,194,304 bytes,
AdamW's step a 4-byte fp32 scalar. Planned on an H100 SXM (80 GiB) with a 1 GiB CUDA context and
10% fragmentation: a budget of (85,899,345,920 - 1,073,741,824) / 1.1 = 77,114,185,541.8 live bytes.
"""

import json

import pytest
import torch

import reports
from tracer import Tracer


def adamw(path, batch, d=1024, steps=1, **tracer):
    with torch.device("meta"):
        model = torch.nn.Linear(d, d, bias=False)
        x = torch.empty(batch, d)
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    with Tracer(path, model=model, tokens=batch, **tracer):
        for _ in range(steps):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    return reports.load(path)


def test_what_the_optimizer_step_makes_does_not_grow_with_the_micro_batch(tmp_path):
    one, four = adamw(tmp_path / "b1", 1), adamw(tmp_path / "b4", 4)
    frame = reports.plan(one, "H100", micro_batch=4)
    row, memory = frame.iloc[0], frame.attrs["plan"][frame["run"].iloc[0]]["memory"]
    # the peak is at AdamW's _foreach_sqrt(exp_avg_sq): weight, gradient, exp_avg, exp_avg_sq and the
    # sqrt's temporary, 5 x 4,194,304, and the step's 4 bytes: 20,971,524 fixed; x [4, 1024] fp32
    # 16,384 growing: 20,987,908, the peak a trace at batch 4 has. Scaling the sqrt's temporary
    # with the batch made it 16,777,220 + 4 x (4,194,304 + 4,096) = 33,570,820
    assert memory["peak_phase"] == "optimizer"
    assert memory["peak_fixed_bytes"] == 20_971_524 and memory["peak_scaled_bytes"] == 16_384
    assert row["peak_bytes_per_rank"] == 20_987_908 == reports.peak(four)["peak_live_bytes"].iloc[0]
    # the largest micro-batch binds at the forward's sum: fixed the weight and the optimizer state
    # every later step holds, 4,194,304 + 8,388,612 = 12,582,916; growing x, x @ W^T and the sum's
    # 0-d output, 4,096 + 4,096 + 4 = 8,196: (77,114,185,541.8 - 12,582,916) / 8,196 = 9,407,223.4
    # (it was (77,114,185,541.8 - 16,777,220) / 4,198,400 = 18,363.1 at the sqrt)
    assert row["max_micro_batch"] == 9_407_223
    # from the trace at 4: the same sum, growing 4 x 8,192 + 4 = 32,772 (the 0-d scalar does not grow):
    # (77,114,185,541.8 - 12,582,916) / 32,772 x 4 = 9,410,667.5 (it was 73,239)
    assert reports.plan(four, "H100").iloc[0]["max_micro_batch"] == 9_410_667
    # the optimizer's time does not scale either: the what-if from batch 1 prices what the trace at 4
    # does, within the 0-d scalar's 4 x 4 - 4 bytes counted as growing
    assert row["memory_bound_s"] == pytest.approx(reports.plan(four, "H100").iloc[0]["memory_bound_s"], rel=1e-6)


class PositionFirst(torch.nn.Module):
    """x = wpe(positions) + wte(idx): the position embedding is looked up first, on indices without
    the batch ([S], or [1, S] as Hugging Face's position_ids)."""

    def __init__(self, positions_shape, vocab=64, seq=8, d=16):
        super().__init__()
        self.shape = positions_shape
        self.wpe, self.wte = torch.nn.Embedding(seq, d), torch.nn.Embedding(vocab, d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        positions = torch.arange(idx.shape[1], device=idx.device).view(self.shape)
        return self.head(self.wpe(positions) + self.wte(idx)).sum()


@pytest.mark.parametrize("positions_shape", [(-1,), (1, -1)])
def test_the_traced_batch_is_the_embedding_indices_that_hold_the_tokens(tmp_path, positions_shape):
    with torch.device("meta"):
        model = PositionFirst(positions_shape)
        idx = torch.zeros(4, 8, dtype=torch.long)
    with Tracer(tmp_path / "t", model=model, tokens=4 * 8):
        model(idx).backward()
    frame = reports.plan(reports.load(tmp_path / "t"), "H100", micro_batch=8)
    # wpe's indices [8] have no batch dimension and [1, 8] hold 8 of the 32 tokens: the batch is
    # wte's [4, 8], 4 x 8 = 32 tokens (it was 8, then 1: the leading size of wpe's indices)
    assert frame.iloc[0]["batch"] == 4 and frame.iloc[0]["micro_batch"] == 8
    assert frame.iloc[0]["tokens_per_step"] == 64  # 32 x 8 / 4
    notes = frame.attrs["plan"][frame["run"].iloc[0]]["notes"]
    assert any("traced 4 (the leading size of the first embedding's indices of 32 tokens)" in n for n in notes)


def test_a_trace_without_a_batch_dimension_says_so(tmp_path, capsys):
    from reports.output.cli import main

    with torch.device("meta"):
        w = torch.nn.Parameter(torch.empty(16))
        x = torch.empty(16)
    with Tracer(tmp_path / "t", tokens=16):
        (w * x).sum().backward()
    frame = reports.plan(reports.load(tmp_path / "t"), "H100")
    assert frame.iloc[0]["batch"] is None and frame.iloc[0]["max_micro_batch"] is None
    notes = frame.attrs["plan"][frame["run"].iloc[0]]["notes"]
    assert any(
        n.startswith("the traced micro-batch could not be found (no forward op with a batch dimension)") for n in notes
    )
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100"]) in (0, None)
    out = capsys.readouterr().out
    assert "micro-batch unknown (traced unknown)" in out and "micro-batch up to" not in out and "N/A" not in out


def test_a_trace_whose_code_raised_says_so_first(tmp_path, capsys):
    from reports.output.cli import main

    with torch.device("meta"):
        model, x = torch.nn.Linear(16, 16, bias=False), torch.empty(4, 16)
    with pytest.raises(RuntimeError):
        with Tracer(tmp_path / "t", model=model, tokens=4):
            model(x).sum().backward()
            raise RuntimeError("out of memory\x1b[31m\nforged line")
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100"]) in (0, None)
    lines = capsys.readouterr().out.splitlines()
    # the exception's escape and newline printed as Python writes them (printable), as the report does
    assert (
        lines[0]
        == r"INCOMPLETE: the traced code raised RuntimeError: out of memory\x1b[31m\nforged line; the plan covers the rows it has"
    )
    assert lines[1].startswith("optrace plan: t on H100 SXM")
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100", "--json"]) in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["complete"] is False and out["error"] == "RuntimeError: out of memory\x1b[31m\nforged line"
    with pytest.warns(UserWarning, match="trace is incomplete"):
        frame = reports.plan(reports.load(tmp_path / "t"), "H100")
    assert frame.iloc[0]["complete"] == False and frame.iloc[0]["error"] == out["error"]  # noqa: E712


def test_a_complete_trace_has_no_error(tmp_path, capsys):
    from reports.output.cli import main

    adamw(tmp_path / "t", 1)
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100", "--json"]) in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["complete"] is True and out["error"] is None
    main(["plan", str(tmp_path / "t"), "--gpu", "H100"])
    assert capsys.readouterr().out.startswith("optrace plan: t on H100 SXM")


def test_a_trace_without_model_says_its_parameters_count_as_inputs(tmp_path):
    with torch.device("meta"):
        model, x = torch.nn.Linear(1024, 1024, bias=False), torch.empty(1, 1024)
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    with Tracer(tmp_path / "t", tokens=1):  # no model=
        model(x).sum().backward()
        opt.step()
    frame = reports.plan(reports.load(tmp_path / "t"), "H100", micro_batch=4, batch=1)
    row, detail = frame.iloc[0], frame.attrs["plan"][frame["run"].iloc[0]]
    # still planned: at AdamW's sqrt, gradient, exp_avg, exp_avg_sq and the sqrt's temporary, 4 x 4,194,304,
    # and the step's 4 bytes stay: 16,777,220; the weight, an input, grows with x: 4 x (4,194,304 + 4,096)
    # = 16,793,600; 33,570,820 (20,987,908 traced with model=, the weight fixed)
    assert detail["memory"]["peak_fixed_bytes"] == 16_777_220 and detail["memory"]["peak_scaled_bytes"] == 16_793_600
    assert row["peak_bytes_per_rank"] == 33_570_820
    assert (
        "the parameters are unknown (the trace was made without model=): their bytes count as inputs, growing "
        "with the micro-batch, so the peak and the largest micro-batch are pessimistic; trace with "
        "Tracer(..., model=model)"
    ) in detail["notes"]
    # without batch=, the batch is read from the first forward input that is not a known parameter: the
    # weight's W.t() [1024, 1024], and the note says so
    notes = reports.plan(reports.load(tmp_path / "t"), "H100").attrs["plan"][frame["run"].iloc[0]]["notes"]
    assert any("pessimistic and the traced batch may be a weight's leading size;" in n for n in notes)
    assert not any(
        "the parameters are unknown" in n
        for n in reports.plan(adamw(tmp_path / "m", 1), "H100").attrs["plan"]["m"]["notes"]
    )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"launch_s": float("inf")}, "assumption launch_s must be in [0, 1] s, got inf"),
        ({"launch_s": 1e308}, "assumption launch_s must be in [0, 1] s, got 1e+308"),  # 1e308 x 900 kernels: inf
        ({"net_step_s": float("nan")}, "assumption net_step_s must be in [0, 1] s, got nan"),
        ({"matmul_efficiency": 1.5}, "assumption matmul_efficiency must be in [0.01, 1], got 1.5"),
        ({"link_efficiency": 0}, "assumption link_efficiency must be in [0.01, 1], got 0"),
        ({"link_efficiency": 1e-320}, "assumption link_efficiency must be in [0.01, 1], got 1e-320"),  # comm time: inf
        ({"fragmentation": 1e300}, "assumption fragmentation must be in [0, 10], got 1e+300"),
        ({"nccl_buffer_bytes": 2**51}, "assumption nccl_buffer_bytes must be in [0, 2^50] bytes, got 2251799813685248"),
        ({"cuda_context_bytes": "1 GiB"}, "assumption cuda_context_bytes must be in [0, 2^50] bytes, got '1 GiB'"),
        ([("launch_s", 1e-6)], "assumptions must be a dict {name: number}, got a list: [('launch_s', 1e-06)]"),
    ],
)
def test_an_assumption_out_of_its_range_is_one_line_naming_it(given, message):
    from reports.plan.assumptions import resolve

    with pytest.raises(reports.ReportError) as raised:
        resolve(given)
    assert str(raised.value) == "plan: " + message


def test_the_ends_of_each_range_are_accepted():
    from reports.plan.assumptions import resolve

    table = resolve(
        {"launch_s": 1, "fragmentation": 10, "cuda_context_bytes": 2**50, "memory_efficiency": 1, "net_step_s": 0}
    )
    assert table["launch_s"] == (1.0, "given") and table["cuda_context_bytes"] == (2.0**50, "given")


def test_the_matmul_stack_defaults_to_its_generations_fit():
    from reports.plan.assumptions import resolve

    # fitted on published runs (reports.plan.assumptions BY_GENERATION): Hopper 0.673, A100 0.776; 1 elsewhere
    assert resolve(generation="hopper")["matmul_stack"][0] == 0.673
    assert resolve(generation="ampere")["matmul_stack"][0] == 0.776
    assert resolve()["matmul_stack"][0] == 1.0 and resolve(generation="blackwell")["matmul_stack"][0] == 1.0
    assert "published run" in resolve(generation="hopper")["matmul_stack"][1]
    assert resolve({"matmul_stack": 1}, generation="hopper")["matmul_stack"] == (1.0, "given")


def test_cli_refuses_an_infinite_assumption_in_one_line(tmp_path, capsys):
    from reports.output.cli import main

    adamw(tmp_path / "t", 1)
    for value in ("inf", "1e309"):  # 1e309 overflows to inf when parsed; before, print_plan raised
        # TypeError: bad operand type for abs(): 'str' on the "inf" plan_json made of the launch time
        assert main(["plan", str(tmp_path / "t"), "--gpu", "H100", "--assume", f"launch_s={value}"]) == 2
        captured = capsys.readouterr()
        assert (
            captured.out == ""
            and captured.err == "optrace plan: error: assumption launch_s must be in [0, 1] s, got inf\n"
        )


def test_an_infinite_figure_prints_as_inf(tmp_path, capsys, monkeypatch):
    from reports.output import plan_text
    from reports.output.cli import main

    with torch.device("meta"):
        model, x = torch.nn.Linear(16, 16, bias=False), torch.empty(4, 16)
    with Tracer(tmp_path / "t", model=model, tokens=4):
        model(x).sum().backward()
    # the inputs that made one (1e308 tokens, an infinite assumption) are refused now; a figure that still overflows
    # prints as inf: tokens/s here made infinite by hand
    figures = plan_text._figures
    monkeypatch.setattr(plan_text, "_figures", lambda frame: {**figures(frame), "tokens_per_s_per_gpu": float("inf")})
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100"]) in (0, None)
    assert "Tokens/s per GPU  inf\n" in capsys.readouterr().out
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100", "--json"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["tokens_per_s_per_gpu"] == "inf"


def test_absurd_tokens_are_refused_in_one_line():
    from tracer import TraceError

    with pytest.raises(
        TraceError,
        match=r"^Tracer: tokens must be an int from 1 to 2\*\*53 \(tokens per step\) or None, "
        r"got 1000000000000000000000000",
    ):
        Tracer("unused", tokens=10**24)


def test_nccl_buffers_count_only_the_groups_that_ran_a_collective(tmp_path):
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:  # HSDP on a 2 x 4 (replicate x shard) mesh: the world group is made, and runs no collective
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("replicate", "shard"))
        with FakeTensorMode():
            model = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 64, bias=False))
            fully_shard(model, mesh=mesh)
            x = torch.randn(8, 64)
            with Tracer(tmp_path / "t", model=model, tokens=8):
                model(x).sum().backward()
    finally:
        dist.destroy_process_group()
    df = reports.load(tmp_path / "t")
    assert len(next(iter(df.attrs["runs"].values()))["process_groups"]) == 3  # world, replicate, shard
    frame = reports.plan(df, "H100")
    memory = frame.attrs["plan"][frame["run"].iloc[0]]["memory"]
    # the shard group's all-gather and reduce-scatter, the replicate group's all-reduce: 2 x 256 MiB =
    # 536,870,912 bytes (3 x 256 MiB = 805,306,368 counted the world group too)
    assert memory["nccl_buffer_bytes"] == 2 * 256 * 2**20 == 536_870_912


def test_the_cpu_target_has_no_gpu_allowances(tmp_path, capsys):
    from reports.output.cli import main

    model = torch.nn.Linear(32, 8, bias=False)
    with Tracer(tmp_path / "cpu", model=model, tokens=16) as tr:
        model(torch.randn(16, 32)).sum().backward()
        tr.set_bandwidth({"bytes_per_s": 1.0e10, "n": 1, "dtype": "float32"})
    frame = reports.plan(reports.load(tmp_path / "cpu"), "cpu", assumptions={"cuda_context_bytes": 2**30})
    row, detail = frame.iloc[0], frame.attrs["plan"][frame["run"].iloc[0]]
    memory = detail["memory"]
    # required: the peak and its 10% fragmentation alone (it was peak x 1.1 + 1 GiB of CUDA context)
    assert memory["cuda_context_bytes"] == 0 and memory["nccl_buffer_bytes"] == 0
    assert row["required_bytes"] == pytest.approx(1.1 * row["peak_bytes_per_rank"], rel=1e-12)
    listed = {a["name"]: a for a in detail["assumptions"]}
    assert listed["cuda_context_bytes"]["value"] == 0 and listed["cuda_context_bytes"]["source"].startswith(
        "none: the target is the CPU"
    )
    assert (
        "the target is the CPU: its memory needs no CUDA context or NCCL buffers, only fragmentation" in detail["notes"]
    )
    assert main(["plan", str(tmp_path / "cpu"), "--gpu", "cpu"]) in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("optrace plan: cpu on cpu, world size 1,") and "per node" not in out
    # the answer in one line, naming what is unknown (it printed "4.41 KiB of N/A: N/A, headroom N/A"): required
    # 1.1 x 4,104 = 4,514.4 bytes (the weight and its gradient 2 x 32 x 8 x 4 = 2,048 fixed, 2,056 growing with
    # the micro-batch) = 4.20e-6 GiB
    first, rest = out.split("\n", 1)
    assert first.startswith(
        "optrace plan: cpu on cpu, world size 1, micro-batch 16 (traced 16): needs 0.00000420 GiB per rank, step "
    )
    assert first.endswith("; fit unknown: no memory size for a CPU") and rest.startswith("\n")
    assert "N/A" not in out and "Memory per rank" not in out


def test_a_trace_of_several_steps_prices_its_last_complete_step(tmp_path):
    one, three = adamw(tmp_path / "k1", 1), adamw(tmp_path / "k3", 1, steps=3)
    frame = reports.plan(three, "H100")
    row, notes = frame.iloc[0], frame.attrs["plan"]["k3"]["notes"]
    # step 2 moves 96,489,504 bytes in 15 kernels: 96,489,504 / (3.35e12 x 0.8) = 36.00 us + 15 x 3 us.
    # Step 0 has AdamW's two zeros_like besides (2 x 8,388,608 bytes read and written): 113,266,720 bytes
    # in 17 kernels; the mean of the three steps priced before, (113,266,720 + 2 x 96,489,504) / 3 bytes
    # and 49 / 3 kernels, held a third of that one-off work
    assert row["memory_bound_s"] == pytest.approx(96_489_504 / 2.68e12, rel=1e-12)
    assert row["launch_s"] == pytest.approx(15 * 3e-6, rel=1e-12)
    assert (
        "step time, FLOPs and MFU are those of step 2, the last complete one of the 3 traced (the first holds "
        "one-off work, such as an optimizer making its state); the memory peak is over every step"
    ) in notes
    # the memory peak is over every step: AdamW's sqrt, as in one step (5 x 4,194,304 + 4 + x's 4,096)
    assert row["peak_bytes_per_rank"] == 20_975_620
    # a one-step trace prices its step, and says the optimizer made its state in it
    frame = reports.plan(one, "H100")
    assert frame.iloc[0]["memory_bound_s"] == pytest.approx(113_266_720 / 2.68e12, rel=1e-12)
    assert frame.iloc[0]["launch_s"] == pytest.approx(17 * 3e-6, rel=1e-12)
    assert frame.iloc[0]["peak_bytes_per_rank"] == 20_975_620
    # exp_avg, exp_avg_sq 2 x 4,194,304 and the step's 4 bytes
    assert (
        "the traced step is the optimizer's first: it makes its state (8,388,612 bytes; AdamW's zeros_like), work "
        "its step time includes and later steps skip (trace two steps to price the steady one)"
    ) in frame.attrs["plan"]["k1"]["notes"]
    assert not any(n.startswith("the traced step is the optimizer's first") for n in notes)


def partial_batches(path, set_to_none=True):
    """A trace at `path` of 12 seeded samples in batches of 5, 5 and 2 (a DataLoader's partial last batch) through
    Linear(64, 256) -> ReLU -> Linear(256, 64), no biases (N = 32,768), the mean square as loss, SGD, tokens=5,
    zero_grad(set_to_none=`set_to_none`)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256, bias=False), torch.nn.ReLU(), torch.nn.Linear(256, 64, bias=False)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 64)), batch_size=5)
    with Tracer(path, model=model, tokens=5):
        for (x,) in loader:
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=set_to_none)
    return path


def test_a_partial_last_batch_is_passed_over_when_gradients_accumulate_into_zeroed_ones(tmp_path):
    """12 samples in batches of 5, 5, 2 through Linear(64, 256) -> ReLU -> Linear(256, 64), no biases, N = 32,768,
    with zero_grad(set_to_none=False): from the second step the backward adds each weight's gradient into the zeroed
    one left (1 FLOP per element, 32,768), so no step's forward + backward FLOPs were the first's, and the plan priced
    the partial batch of 2 as the batch of 5 it reads. The forward FLOPs find step 1, of the first's batch."""
    df = reports.load(partial_batches(tmp_path / "t", set_to_none=False))
    # forward 2·N·5 = 327,680 + relu 1,280 + square 320 + mean 320 = 329,600; backward at step 0: dL/dW 327,680 +
    # dL/dx 2·5·256·64 = 163,840 + 2,560 of the small ops = 494,080, + the accumulating add 32,768 from step 1
    forward = df[df["phase"] == "forward"].groupby("step")["flops"].sum().tolist()
    backward = df[df["phase"] == "backward"].groupby("step")["flops"].sum().tolist()
    assert (forward, backward) == ([329600, 329600, 131840], [494080, 526848, 230400])
    table = reports.plan(df, gpu="H100")
    planned, notes = table.iloc[0], " ".join(table.attrs["plan"]["t"]["notes"])
    assert planned["batch"] == 5
    assert planned["model_flops_per_step"] == 329600 + 526848  # step 1's; was step 2's 131,840 + 230,400 = 362,240
    assert "those of step 1" in notes and "step 2 has 131,840: a partial last batch" in notes


def test_a_damaged_trace_says_so_in_the_plan(tmp_path, capsys):
    """A trace with a part deleted is planned from the rows it has (as the report is), and the plan names the damage
    in its notes (text and --json), as the report, --json and export do: not only in a note on stderr."""
    import os

    from reports.output.cli import main
    from tracer.schema import part_paths

    with torch.device("meta"):
        model, x = torch.nn.Linear(16, 16, bias=False), torch.empty(4, 16)
    with Tracer(tmp_path / "t", model=model, tokens=4, flush_rows=2):
        for _ in range(3):
            model(x).sum().backward()
    parts = part_paths(tmp_path / "t")
    assert len(parts) >= 3
    os.remove(parts[1])  # 2 rows (one part of flush_rows=2) gone
    damage = "the trace is damaged: 2 rows missing from disk (a part deleted?); 1 part file(s) missing; 1 gap(s) in seq"
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100", "--json"]) in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["complete"] is True and any(n.startswith(damage) for n in out["notes"])
    assert main(["plan", str(tmp_path / "t"), "--gpu", "H100"]) in (0, None)
    assert damage in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("column", ["step", "input_shapes"])
def test_a_frame_with_a_null_where_reports_load_gives_none_is_a_report_error(tmp_path, column):
    """reports.plan of a DataFrame edited to hold a null where reports.load never gives one (tracer's NOT_NULL
    columns: a NaN step, a None shapes cell) is one ReportError naming the column and the row, not a ValueError or
    TypeError from inside the plan."""
    from reports.errors import ReportError

    df = adamw(tmp_path / "t", 4)
    df[column] = df[column].astype(object)
    df.loc[df.index[2:], column] = None  # every row from the third on
    seq = int(df["seq"].iloc[2])
    with pytest.raises(ReportError, match=rf"plan: column '{column}' is null at seq {seq} \({len(df) - 2} null"):
        reports.plan(df, "H100")
