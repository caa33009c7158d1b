"""reports.plan.comm's overlap model: what the compute stream waits for, one stream per process group.

The literal cases run `simulate` on small hand-made steps: each row an op with its input and output
storage ids, its price (`op_s`, seconds on the compute stream; 0: a view, no kernel) and, for a
collective, its kind and price (`comm_s`) on its process group's stream. Times are in ms x 1e-3.
"""

import sys

import numpy as np
import pandas as pd
import pytest

import reports
from reports.plan.comm import simulate, tensor_parallel
from tests import helpers

MS = 1e-3


def _step(ops):
    """(rows, op_s, comm_s, kinds) of one step from [(op, kind or '', group, ins, outs, op_ms, comm_ms)]."""
    rows = pd.DataFrame(
        {
            "op": [o[0] for o in ops],
            "process_group": [o[2] for o in ops],
            "input_storage_ids": [list(o[3]) for o in ops],
            "output_storage_ids": [list(o[4]) for o in ops],
            "step": 0,
        }
    )
    op_s = np.array([o[5] * MS for o in ops])
    comm_s = np.array([o[6] * MS for o in ops])
    kinds = np.array([o[1] for o in ops], dtype=object)
    return rows, op_s, comm_s, kinds


def _views_after_a_reduce_scatter():
    return _step(
        [
            ("aten.mm", "", None, [1], [2], 1.0, 0),  # a gradient, storage 2
            ("c10d._reduce_scatter_base_", "reduce_scatter", "0", [2], [3], 0, 0.5),  # its shard, storage 3
            *[("aten.as_strided", "", None, [3], [3], 0, 0)] * 3,  # FSDP2's views of the shard: no kernel
            ("aten.mm", "", None, [4], [5], 2.0, 0),  # the next layer's backward reads none of it
            ("aten._foreach_add_", "", None, [6, 3], [6], 0.1, 0),  # the optimizer reads the shard
        ]
    )


def test_views_of_a_reduce_scatter_output_do_not_stall_the_compute_stream():
    step, busy, spent, waited = simulate(*_views_after_a_reduce_scatter())[0]
    # the reduce-scatter runs 1.0 -> 1.5 ms on its stream beside the 2 ms matmul (1.0 -> 3.0 ms); the optimizer
    # reads its output at 3.0 ms, long ready: step 3.0 + 0.1 = 3.1 ms = compute 1.0 + 2.0 + 0.1, 0 exposed.
    # (Before: the first view waited for the reduce-scatter, 1.5 ms, and the step took 3.6 ms, 0.5 ms exposed.)
    assert step == pytest.approx(3.1 * MS, rel=1e-12) and busy == pytest.approx(3.1 * MS, rel=1e-12)
    assert step - busy == pytest.approx(0, abs=1e-15) and spent == pytest.approx(0.5 * MS, rel=1e-12)
    assert waited == {}
    serial = simulate(*_views_after_a_reduce_scatter(), overlap="none")[0]
    assert serial[0] == pytest.approx(3.6 * MS, rel=1e-12)  # 3.1 + 0.5: every collective blocks
    assert serial[3] == {"reduce_scatter": pytest.approx(0.5 * MS, rel=1e-12)}


def test_an_op_that_reads_a_view_waits_for_the_collective():
    rows, op_s, comm_s, kinds = _step(
        [
            ("aten.mm", "", None, [1], [2], 1.0, 0),
            ("c10d._reduce_scatter_base_", "reduce_scatter", "0", [2], [3], 0, 0.5),
            ("aten.alias", "", None, [3], [7], 0, 0),  # a zero-cost op that names a new storage
            ("aten.mul", "", None, [7], [8], 0.1, 0),  # reads it: waits for the reduce-scatter
        ]
    )
    step, busy, _, waited = simulate(rows, op_s, comm_s, kinds)[0]
    # the reduce-scatter ends at 1.0 + 0.5 = 1.5 ms; the mul waits 0.5 ms for it and ends at 1.6 ms
    assert step == pytest.approx(1.6 * MS, rel=1e-12) and busy == pytest.approx(1.1 * MS, rel=1e-12)
    assert waited == {"reduce_scatter": pytest.approx(0.5 * MS, rel=1e-12)}


def _two_groups(tp_group):
    return _step(
        [
            ("c10d._allgather_base_", "all_gather", "dp", [9], [10], 0, 1.0),  # FSDP2 prefetches the next unit
            ("aten.mm", "", None, [1], [2], 0.5, 0),
            ("_c10d_functional.all_reduce", "all_reduce", tp_group, [2], [3], 0, 0.2),  # tensor parallelism
            ("aten.add", "", None, [3, 1], [4], 0.1, 0),
            ("aten.mm", "", None, [10, 4], [5], 0.5, 0),  # the next unit reads the all-gather
        ]
    )


def test_each_process_group_has_its_own_stream():
    step, busy, spent, waited = simulate(*_two_groups("tp"))[0]
    # dp's stream: the all-gather 0 -> 1.0 ms. tp's: the all-reduce starts after the matmul, 0.5 -> 0.7 ms; the
    # add waits 0.2 ms for it (0.7 -> 0.8), the next matmul 0.2 ms for the all-gather (1.0 -> 1.5):
    # step 1.5 ms, compute 0.5 + 0.1 + 0.5 = 1.1 ms, exposed 0.2 + 0.2 = 0.4 ms of 1.2
    assert step == pytest.approx(1.5 * MS, rel=1e-12) and busy == pytest.approx(1.1 * MS, rel=1e-12)
    assert spent == pytest.approx(1.2 * MS, rel=1e-12)
    assert waited == {"all_reduce": pytest.approx(0.2 * MS, rel=1e-12), "all_gather": pytest.approx(0.2 * MS)}
    # on one stream the all-reduce queues behind the all-gather: 1.0 -> 1.2 ms, the add 1.2 -> 1.3, the matmul
    # 1.3 -> 1.8: step 1.8 ms, 0.7 ms exposed
    one = simulate(*_two_groups("dp"))[0]
    assert one[0] == pytest.approx(1.8 * MS, rel=1e-12) and one[0] - one[1] == pytest.approx(0.7 * MS, rel=1e-12)


def test_a_collective_reading_another_waits_for_it():
    rows, op_s, comm_s, kinds = _step(
        [
            ("aten.mm", "", None, [1], [2], 1.0, 0),
            ("c10d._reduce_scatter_base_", "reduce_scatter", "shard", [2], [3], 0, 0.5),
            ("c10d.allreduce_", "all_reduce", "replicate", [3], [3], 0, 0.3),  # HSDP: the shard across replicas
            ("aten.mm", "", None, [4], [5], 2.0, 0),
            ("aten._foreach_add_", "", None, [3], [3], 0.1, 0),
        ]
    )
    step, busy, _, waited = simulate(rows, op_s, comm_s, kinds)[0]
    # reduce-scatter 1.0 -> 1.5 ms, then the all-reduce 1.5 -> 1.8 (not 1.0 -> 1.3, beside it): hidden under
    # the 2 ms matmul (1.0 -> 3.0); the optimizer at 3.0 -> 3.1 ms
    assert step == pytest.approx(3.1 * MS, rel=1e-12) and waited == {}
    rows.loc[3, "input_storage_ids"] = [3]  # the matmul reads the all-reduced shard: waits 1.8 - 1.0 = 0.8 ms
    step, busy, _, waited = simulate(rows, op_s, comm_s, kinds)[0]
    assert step == pytest.approx(3.9 * MS, rel=1e-12) and waited == {"all_reduce": pytest.approx(0.8 * MS)}


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory):
    """Two AdamW steps of rank 0 of an 8-rank FSDP2 job of examples/gpt.py (2 blocks, d 512, 8 heads, sequences
    of 512, bf16 parameters, fp32 reduction), traced by examples/simulate.py."""
    sys.path.insert(0, str(helpers.EXAMPLES))
    from gpt import GPTConfig
    from simulate import simulate as trace

    cfg = GPTConfig(vocab_size=4096, seq_len=512, n_layer=2, n_head=8, d_model=512, bias=False, attention="sdpa")
    return reports.load(trace(str(tmp_path_factory.mktemp("comm") / "fsdp2"), 8, cfg, 1, steps=2))


def test_fsdp2_views_of_collective_outputs_change_no_step_time(fsdp2):
    """The FSDP2 step planned as traced and with every view of a collective's output left out: the same
    exposed communication (a view is no work and no wait). Before the fix the views after each
    reduce-scatter stalled the compute stream, and leaving them out hid part of the communication."""
    comm = fsdp2["comm_bytes"].notna()
    written = {int(s) for ids in fsdp2.loc[comm, "output_storage_ids"] for s in ids}
    views = fsdp2["is_view"].astype(bool) & fsdp2["input_storage_ids"].map(lambda ids: bool(written & set(ids)))
    assert views.sum() > 0
    kept, full = fsdp2[~views].copy(), fsdp2
    kept.attrs = fsdp2.attrs
    a, b = reports.plan(full, "H100").iloc[0], reports.plan(kept, "H100").iloc[0]
    assert 0 < a["exposed_comm_s"] < a["comm_s"]
    assert a["exposed_comm_s"] == pytest.approx(b["exposed_comm_s"], rel=1e-12)


def test_tensor_parallel_degree_is_the_group_reducing_activations_in_the_forward():
    rows = pd.DataFrame(
        {
            "op": [
                "c10d._allgather_base_.default",  # FSDP2's all-gather in the forward: not tensor parallelism
                "_c10d_functional.all_reduce.default",  # a loss averaged in the forward: one element
                "_c10d_functional.all_reduce.default",  # a row-parallel linear's output: [2, 64, 64]
                "c10d._reduce_scatter_base_.default",  # FSDP2's gradients, in the backward
                "c10d.allreduce_.default",  # tokens per expert (64 experts) in the forward: fewer than the tokens
            ],
            "phase": ["forward", "forward", "forward", "backward", "forward"],
            "process_group": ["1", "0", "9", "1", "0"],
            "group_size": [8, 64, 4, 8, 64],
            "comm_bytes": [1024.0, 4.0, 32768.0, 1024.0, 256.0],
            "input_shapes": [[[256]], [[]], [[2, 64, 64]], [[256]], [[64]]],
        }
    )
    # the rank's 2 x 64 = 128 tokens: the [2, 64, 64] all-reduce (8,192 elements) is one of activations, the
    # 64 counts per expert are fewer than the tokens
    assert tensor_parallel(rows, tokens=128) == (4, "9")
    assert tensor_parallel(rows.iloc[[0, 1, 3, 4]], tokens=128) == (1, None)
    assert tensor_parallel(rows.iloc[[0, 1, 3, 4]]) == (64, "0")  # tokens unknown: any tensor of 2 elements or more
