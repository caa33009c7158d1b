"""`optrace plan`'s answer: fits or not, by how much, the smallest change that would fit
(reports.plan.changes), then step time, tokens/s per GPU and MFU, in at most 25 lines; GiB in the
text, integers of bytes in --json; the assumptions behind --assumptions; no step time for a plan
that does not fit unless --anyway; a one-line answer for a target without a memory size (the CPU).

The traces are tests.reports.plan.test_plan's: a bf16 stack of 4 Linear(8192, 8192) on the meta
device, x [1024, 8192] (its module docstring has the arithmetic), and tests.tracer.distributed.
test_job's FSDP2 job of 4 Linear(64, 64) over 4 ranks.
"""

import json

import numpy as np
import pytest

from reports.output.cli import main
from tests.reports.plan.test_plan import stack
from tests.tracer.distributed.test_job import simulate

H100_MEMORY = 80 * 2**30  # 85,899,345,920
NCCL = 256 * 2**20  # 268,435,456: one process group with a collective


@pytest.fixture(scope="module")
def linear(tmp_path_factory):
    path = tmp_path_factory.mktemp("answer") / "t"
    stack(path, 8192)
    return str(path)


def _plan(capsys, *args):
    assert main(["plan", *args]) in (0, None)
    return capsys.readouterr().out


def test_a_plan_that_fits_answers_in_25_lines(linear, capsys):
    out = _plan(capsys, linear, "--gpu", "H100")
    lines = out.splitlines()
    # it printed 61 lines for examples/simulate.py's trace (40 of assumptions and their sources); this one 17
    assert len(lines) <= 25 and max(map(len, lines)) <= 100
    assert lines[:5] == [
        "optrace plan: t on H100 SXM (8 per node), world size 1, micro-batch 1024 (traced 1024)",
        # required 2,291,767,710 bytes = 2.13 GiB; headroom 83,607,578,210 = 77.87 GiB (test_plan.test_cli)
        "Fits: needs 2.13 GiB of 80.00 GiB per rank, 77.87 GiB spare; micro-batch up to 931504 fits",
        # 1,511,828,488,192 FLOPs / (989.4e12 x 0.6917, the GEMM sweep's at these shapes: test_plan.test_cli,
        # x 0.673, Hopper's matmul_stack: reports.plan.assumptions BY_GENERATION) = 3.28 ms compute-bound, + 6 us
        # memory-bound and 39 us of launches
        "Step time         3.33 ms: compute 3.33 ms + exposed communication 0 s (of 0 s)",
        "Tokens/s per GPU  308 k",  # 1,024 tokens / 3.33 ms
        "MFU               45.9% of 989 TFLOP/s (1.51 TFLOP per step)",  # 1.5118e12 / (3.3278e-3 x 989.4e12)
    ]
    # one unit of memory: GiB (it mixed "1 GiB" with "1.074e+09 bytes")
    assert "  CUDA context    1.00 GiB" in lines and "bytes" not in out and "MiB" not in out
    assert "mamf-finder" not in out and "matmul_efficiency" not in out
    assert lines[-1] == "22 assumptions (0 given): --assumptions lists them with their sources"


def test_assumptions_print_with_their_sources_on_request(linear, capsys):
    out = _plan(capsys, linear, "--gpu", "H100", "--assumptions")
    lines = out.splitlines()
    at = lines.index("Assumptions")
    # the sweep's 0.6917 at these shapes x Hopper's matmul_stack 0.673 = 0.4655
    assert lines[at + 1] == "  matmul_efficiency        0.4655" and "GEMM sweep" in " ".join(lines[at + 2 : at + 5])
    assert "  cuda_context_bytes       1.00 GiB" in lines  # 1,073,741,824 bytes (it printed 1.074e+09 bytes)
    assert "  device_memory_bytes      80.00 GiB" in lines and "  launch_s                 3 us" in lines
    assert "What every plan rests on" in lines and max(map(len, lines)) <= 100


def test_a_plan_that_does_not_fit_gives_its_shortfall_and_smallest_change(linear, capsys):
    out = _plan(capsys, linear, "--gpu", "H100", "--micro-batch", "1000000")
    lines = out.splitlines()
    # required 92,071,583,126 bytes = 85.75 GiB; short 92,071,583,126 - 85,899,345,920 = 6,172,237,206 = 5.75 GiB
    assert lines[1] == "DOES NOT FIT: needs 85.75 GiB of 80.00 GiB per rank, 5.75 GiB short"
    # the largest micro-batch that fits, 931,504 (test_plan.test_cli), needs 85,899,271,279 bytes <= 80 GiB
    assert lines[2] == "Smallest change that fits: micro-batch 931504 (80.00 GiB): the largest that fits"
    # no step time for a step that cannot run (it printed one, and "largest micro-batch 0" when none fitted)
    assert "Step time         not shown: the plan does not fit (--anyway prints it)" in lines
    assert not [line for line in lines if line.startswith(("Tokens/s", "MFU", "Compute per step"))]
    anyway = _plan(capsys, linear, "--gpu", "H100", "--micro-batch", "1000000", "--anyway")
    # at 1,000,000 / 1,024 = 977x the FLOPs every GEMM's k passes the sweep's 4096: 4096^3's 0.7917 x Hopper's
    # matmul_stack 0.673, 2.90 s (1.95 s at the sweep's own figure / 0.673), + 6 ms memory-bound
    assert "Step time         2.91 s: compute 2.91 s + exposed communication 0 s (of 0 s)" in anyway.splitlines()


def test_json_keeps_its_keys_and_adds_the_verdict_in_integer_bytes(linear, capsys):
    found = json.loads(_plan(capsys, linear, "--gpu", "H100", "--micro-batch", "1000000", "--json"))
    assert found["fits"] is False and found["verdict"] == "does not fit"
    assert found["required_bytes"] == 92_071_583_126 and found["device_memory_bytes"] == 85_899_345_920
    # the peak was 82,725,310,274.25 bytes (a float: the activations x 1,000,000 / 1,024)
    assert found["peak_bytes_per_rank"] == 82_725_310_274 and found["memory"]["peak_bytes_per_rank"] == 82_725_310_274
    assert found["headroom_bytes"] == 85_899_345_920 - 92_071_583_126 == -found["shortfall_bytes"]
    assert found["smallest_change"] == {
        "change": "micro_batch",
        "value": 931_504,
        "fits": True,
        "required_bytes": 85_899_271_279,
        "how": "the largest that fits",
    }
    assert [c["change"] for c in found["changes"]] == ["micro_batch", "world_size", "activation_checkpointing"]
    assert found["changes"][1]["fits"] is None  # one unsharded rank: FSDP over more needs a trace of it
    budget = {a["name"]: a["value"] for a in found["assumptions"]}
    assert budget["cuda_context_bytes"] == 2**30 and isinstance(budget["nccl_buffer_bytes"], int)
    assert found["step_time_s"] > 0 and found["max_micro_batch"] == 931_504  # every key kept
    fits = json.loads(_plan(capsys, linear, "--gpu", "H100", "--json"))
    assert (fits["verdict"], fits["shortfall_bytes"], fits["smallest_change"], fits["changes"]) == (
        "fits",
        None,
        None,
        [],
    )


def test_more_ranks_is_the_smallest_change_when_the_fixed_bytes_do_not_fit(tmp_path, capsys):
    simulate(tmp_path / "w4", 4)
    # room for 103,000 bytes of the rank's own: the memory less the NCCL buffers and a context of the rest
    context = H100_MEMORY - NCCL - 103_000
    args = ("--gpu", "H100", "--assume", "fragmentation=0", "--assume", f"cuda_context_bytes={context}", "--json")
    found = json.loads(_plan(capsys, str(tmp_path / "w4"), *args))
    # the peak, 131,096 bytes, is 28,096 over the 103,000
    assert found["peak_bytes_per_rank"] == 131_096 and found["shortfall_bytes"] == 28_096
    # parameters, gradients and optimizer state are fixed, and at the op of most bytes over 4 ranks
    # (129,048 live, 53,264 of them shards) over any micro-batch: micro-batch 1 does not fit
    assert found["changes"][0] == {
        "change": "micro_batch",
        "value": 1,
        "fits": False,
        "required_bytes": found["changes"][0]["required_bytes"],
        "how": "the least, and it does not fit",
    }
    # over 7 ranks the shards are 4/7 of the traced: 106,513 bytes at the most; over 8, 102,416 <= 103,000
    assert found["smallest_change"]["change"] == "world_size" and found["smallest_change"]["value"] == 8
    assert found["smallest_change"]["required_bytes"] == H100_MEMORY - 103_000 + 102_416
    simulate(tmp_path / "w8", 8)  # and the re-trace at 8 ranks fits: 102,424 bytes
    retraced = json.loads(_plan(capsys, str(tmp_path / "w8"), *args))
    assert retraced["verdict"] == "fits" and retraced["peak_bytes_per_rank"] == 102_424


def test_changes_price_each_term_of_the_model():
    from reports.plan.changes import Need, changes, smallest

    # two ops: fixed [100, 200], scaled [50, 100] at the traced micro-batch 2; no fragmentation or allowances
    need = Need(
        fixed=np.array([100, 200]),
        scaled=np.array([50, 100]),
        parts={"activations": np.array([40, 80]), "sharded": np.array([80, 160]), "fsdp": True, "checkpointed": False},
        k=1.0,
        frag=0.0,
        allowances=0.0,
        memory=250.0,
    )
    # required max(150, 300) = 300 > 250; k_max = min((250 - 100) / 50, (250 - 200) / 100) = 0.5: micro-batch 1
    micro, world, ckpt = changes(need, batch=2, planned=2, max_micro_batch=1, world=4)
    assert micro == {"change": "micro_batch", "value": 1, "fits": True, "required_bytes": 250.0,
                     "how": "the largest that fits"}  # fmt: skip  # max(100 + 25, 200 + 50)
    # op 2 is 50 over: 160 x (1 - 4 / W) >= 50, W >= 640 / 110 = 5.82: 6 ranks, 200 - 160 / 3 + 100 = 246.67
    assert world["value"] == 6 and world["fits"] is True and world["required_bytes"] == pytest.approx(740 / 3)
    # without activations: max(100 + 10, 200 + 20) = 220 <= 250: it may fit, a re-trace tells
    assert ckpt["fits"] is None and ckpt["required_bytes"] == 220.0
    assert smallest([micro, world, ckpt]) is micro and smallest([world, ckpt]) is world and smallest([ckpt]) is None
    done = need._replace(parts={**need.parts, "checkpointed": True, "fsdp": False})
    _, world, ckpt = changes(done, batch=2, planned=2, max_micro_batch=1, world=4)
    assert world["fits"] is False and ckpt["fits"] is False and ckpt["how"].startswith("already in the trace")


def test_a_run_stopped_by_a_signal_says_which(linear):
    import io

    import reports
    from reports.output.plan_text import print_plan

    frame = reports.plan(reports.load(linear), "H100")
    frame["complete"], frame["signal"] = False, "SIGTERM"  # as reports.plan records a run SIGTERM stopped
    out = io.StringIO()
    print_plan(frame, out)
    # it said "cut short": the text read the signal from figures that never held it
    assert out.getvalue().splitlines()[0] == "INCOMPLETE (stopped by SIGTERM): the plan covers the rows it has"


def test_the_mfu_line_with_causal_attention_keeps_to_100_columns(tmp_path, capsys):
    """examples/gpt.py's GPT (1 block, d 2,048, 16 heads, fused causal attention, sequences of 2,048, batch
    2) on the meta device: its MFU line with the masked half ran to 103 columns (docs/plan.md's Llama-3-8B
    line: 102). The masked half goes to a line of its own under the figures when the line would pass 100."""
    import sys

    import torch

    from tests import helpers
    from tracer import Tracer

    sys.path.insert(0, str(helpers.EXAMPLES))
    from gpt import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=1024, seq_len=2048, n_layer=1, n_head=16, d_model=2048, bias=False, attention="sdpa")
    with torch.device("meta"):
        model = GPT(cfg).to(torch.bfloat16)
        idx = torch.zeros(2, 2048, dtype=torch.long)
    with Tracer(tmp_path / "gpt", model=model, tokens=2 * 2048):
        model(idx, idx).backward()
    lines = _plan(capsys, str(tmp_path / "gpt"), "--gpu", "H100").splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("MFU"))
    assert len(lines[at]) <= 100 and len(lines[at + 1]) <= 100
    assert lines[at + 1].startswith(" " * 18) and lines[at + 1].endswith("with causal attention's masked half")
