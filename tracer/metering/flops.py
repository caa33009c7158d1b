"""What a metered step ran and what a traced step cost (tracer.metering.meter): the signature of a step's inputs,
their size, its tokens, and the FLOPs of a traced step read back from its rows by tracer.rules's rules."""

import bisect
import math
import operator
from collections.abc import Mapping

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils._pytree import tree_leaves

from tracer.errors import TraceError
from tracer.rules import DTYPE_KINDS, carrying_dtype, dtype_rows, score_share, skipped_input

__all__ = ["READ", "input_size", "nodes_made", "read_rows", "settled", "signature", "step_flops", "token_count"]

# graph nodes made so far by this thread (torch >= 2.1; without it the signature is the root's inputs alone)
nodes_made = getattr(torch.autograd, "_get_sequence_nr", lambda: 0)

_SCALARS = (int, float, str, type(None))  # inputs that hold no tensor
READ = [
    "step",
    "op",
    "phase",
    "flops",
    "flop_kind",
    "recompute",
    "input_shapes",
    "input_dtypes",
]  # what step_flops reads


def read_rows(parts, first, end):
    """The READ columns of the rows numbered `first` to `end` - 1 (seq) of the trace parts `parts`, as lists
    (what `pq.read_table(parts, columns=READ, filters=...).to_pydict()` gives, without pyarrow.dataset, which
    imports pandas). The tracer writes each part's rows in seq order (tracer.store.row_buffer.RowBuffer.table), so a part's
    rows of the range are one slice; a part whose seq statistics lie outside it is not read."""
    found = {name: [] for name in READ}
    for path in parts:
        file = pq.ParquetFile(path)
        column = file.schema_arrow.get_field_index("seq")
        stats = [file.metadata.row_group(g).column(column).statistics for g in range(file.metadata.num_row_groups)]
        if all(s is not None and s.has_min_max for s in stats) and (
            not stats or max(s.max for s in stats) < first or min(s.min for s in stats) >= end
        ):
            continue
        table = file.read(columns=["seq", *READ])
        seq = table.column("seq").to_pylist()
        lo, hi = bisect.bisect_left(seq, first), bisect.bisect_left(seq, end)
        for name, values in table.slice(lo, hi - lo).drop_columns(["seq"]).to_pydict().items():
            found[name].extend(values)
    return found


def signature(args, kwargs):
    """Shapes and dtypes of every tensor in `args` and `kwargs`, at any depth: pytree's containers (lists,
    tuples, dicts, registered ones) and any other mapping (a Hugging Face BatchEncoding) are walked."""
    sig = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):  # the common case without pytree: it costs 3 us a call
            sig.append((value.shape, value.dtype) if not value.is_nested else _nested(value))
        elif not isinstance(value, _SCALARS):
            for leaf in tree_leaves(value):  # tree_flatten without building the spec
                if isinstance(leaf, torch.Tensor):
                    sig.append((leaf.shape, leaf.dtype) if not leaf.is_nested else _nested(leaf))
                elif isinstance(leaf, Mapping):
                    sig.extend(signature((), dict(leaf)))
    return tuple(sig)


def _nested(t):
    """(sizes as ints, dtype[, offsets]) of a nested tensor, which has symbolic sizes (jagged: a new one for each
    batch, which no arithmetic takes) or none (strided): it stands for its stored values, read with no op
    dispatched (the hook may run inside a traced step): a jagged tensor's packed values' shape and its offsets
    tensor, read as ints at the step's end (`settled`: attention's FLOPs grow with each sequence's length
    squared, so (2, 6) and (4, 4) are two signatures), a strided one's element count."""
    global _jagged_seen
    values = getattr(t, "_values", None)  # torch.nested's jagged NestedTensor
    if isinstance(values, torch.Tensor):
        offsets = getattr(t, "_offsets", None)
        _jagged_seen = True
        return values.shape, t.dtype, offsets if isinstance(offsets, torch.Tensor) else ()
    return (t.numel(),), t.dtype


def settled(inputs):
    """The root calls' signatures as a key: a jagged tensor's offsets read as ints (after the step's device
    sync, with the tracer paused; a device tensor costs a copy to the host). Until the process has seen a jagged
    input, the signatures as they are: 0.03 us a step instead of 0.5 (tests/tracer/recording/test_step_boundaries.py covers both)."""
    if not _jagged_seen:
        return tuple(inputs)
    return tuple(tuple(_settle(entry) for entry in call) for call in inputs)


_jagged_seen = False  # a jagged tensor was among a root's inputs in this process (`_nested`)


def _settle(entry):
    if len(entry) == 3 and isinstance(entry[2], torch.Tensor):
        try:
            return entry[0], entry[1], tuple(entry[2].tolist())
        except Exception:  # offsets without data (meta, fake): the packed shape alone, as before
            return entry[0], entry[1], ()
    return entry


def step_flops(rows):
    """{model_flops, hardware_flops, recompute_flops, optimizer_flops, dtype} of the rows of a traced step (a dict
    of column lists as pyarrow's to_pydict gives them), by tracer.rules's rules as reports.mfu applies them."""
    flops = np.asarray(rows["flops"], dtype=np.int64)
    again = np.asarray([bool(r) for r in rows["recompute"]], dtype=bool)  # bool even for a step with no rows
    phase = rows["phase"]
    training = np.asarray([p in ("forward", "backward") for p in phase], dtype=bool) & ~again
    kinds = rows["flop_kind"]
    scores = sum(  # fused attention backward: the share that recomputes q @ kᵀ
        score_share(int(flops[i]), rows["input_shapes"][i])
        for i, kind in enumerate(kinds)
        if kind == "attention" and phase[i] == "backward" and not again[i]
    )
    names, carried = [], []
    for i in np.flatnonzero(dtype_rows([k in DTYPE_KINDS for k in kinds], flops)):
        dtypes = rows["input_dtypes"][i]
        if dtypes:
            names.append(dtypes[skipped_input(rows["op"][i], len(dtypes))])
            carried.append(flops[i])
    return {
        "model_flops": int(flops[training].sum()) - scores,
        "hardware_flops": int(flops.sum()),
        "recompute_flops": int(flops[again].sum()) + scores,
        "optimizer_flops": int(flops[np.asarray([p == "optimizer" for p in phase], dtype=bool)].sum()),
        "dtype": carrying_dtype(names, carried),
    }


def input_size(inputs):
    """(input elements, (rank, dtype) of every input tensor) of a signature's root inputs."""
    elements, form = 0, []
    for call in inputs:
        for shape, dtype, *_ in call:  # a jagged tensor's offsets: its size is its packed values'
            elements += math.prod(shape)
            form.append((len(shape), dtype))
    return elements, tuple(form)


def token_count(tokens):
    """`step(tokens=)` as an int: an int, a numpy integer or a 0-d integer tensor (`mask.sum()`)."""
    try:
        count = None if isinstance(tokens, bool) else operator.index(tokens)
    except Exception:  # not an integer; a tensor without data (meta, fake) raises its own error
        count = None
    if count is None or count < 0:
        given = (
            f"a tensor of shape {tuple(tokens.shape)} and dtype {tokens.dtype}"
            if isinstance(tokens, torch.Tensor) and tokens.dim()
            else repr(tokens)
        )
        raise TraceError(f"Meter.step: tokens must be an int >= 0 (this step's tokens) or None, got {given}")
    return count
