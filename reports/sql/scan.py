"""The report views computed from a few scans of the trace instead of a scan each (reports.sql.engine).

views.sql defines every view over `rows`, the Parquet parts: plain SQL another engine runs as it is
written. Run that way, a report scans the parts about ten times (the dtype of a row alone, read from
two list columns, costs more than the rest of a scan). The engine instead groups the rows once into
small tables (GRAINS, each a table of one scan) and defines the views listed in VIEWS from them.
Every sum is an integer sum (exact in any order) and every key of a view is a key of its grain, so each
view holds what views.sql's definition holds, column for column and type for type
(tests/reports/sql/test_sql_scan.py compares them on every test trace):

    _ops    per run, op, phase, FLOP kind, view flag, dtype, FLOPs, algorithmic bytes (views and collectives none),
            process group and group size: op_facts, by_dtype, roofline_op, collective_totals and
            roofline_groups (the roofline's split by bound, reports.time.roofline), which needs each row's FLOPs
            and bytes (keys here). Rows of one op with the same shapes share a group: its size follows the
            distinct shapes per op and phase, not the rows (a few hundred groups for a 1M-row trace).
            Its `null_lists` (a trace read once into memory): whether a row of the group has a null list cell
            or a null id or size item, which the engine's checks refuse (the lists read in this scan; a trace
            read from its files has them checked by reports.sql.rowpass, and the grain reads no list
            but the two dtype lists).
            Also keyed by what flops.sql's flop_rest groups by and flop_marked's `walked` reads of a row (the
            first input dtype, the recompute flag, whether a mul or div has a scalar operand): flop_rest, the
            rows of the FLOP sections that no walk reads, is summed from it instead of a scan of its own (unless
            the Trace's read of the parts kept flop_rest: reports.sql.flop_rows). Without those keys, the grain of
            a run whose read of the parts fed a reports.sql.kept_ops.Ops is made from it, not scanned
    _steps  per run, step and phase: phase_steps, run_totals, by_step, the peak's live bytes and flop_steps

A trace of several runs leaves out of both what only flop_rest and flop_steps read (`grains(several)`): its FLOP
sections are run 0's, read by flops.sql's definitions over run 0's rows.

`files_query(read)` is the seq check's scan of a trace read once into memory: per part, the range of seq - row
number (seq increases row by row in a part whose range is one value: seq = first + row number).
"""

import os
import re

__all__ = ["GRAINS", "VIEWS", "files_query", "grains", "source", "source_views", "views"]

_DTYPE = (
    "CASE WHEN coalesce(input_dtypes[1], '') <> '' THEN input_dtypes[1] "
    "ELSE coalesce(output_dtypes[1], '') END"
)  # (views.sql row_dtype)

# flops.sql flop_marked's test of a mul or div for a scalar operand (one input, or two of which one has one element),
# made per row by the _ops grain for the ops whose name could be aten.mul or aten.div (NULL for the others)
_SCALAR_OPERAND = (
    "CASE WHEN starts_with(op, 'aten.mul') OR starts_with(op, 'aten.div') THEN "
    "len(input_storage_ids) = 1 OR len(input_storage_ids) = 2 "
    "AND (coalesce(list_product(input_shapes[1]), 1) = 1 "
    "OR coalesce(list_product(input_shapes[2]), 1) = 1) END"
)

# flops.sql flop_rest's first_dtype (input_dtypes[1:1]) as a small key beside the grain's dtype, which is the first
# input dtype where that is a non-empty string (a list slice per row cost about 0.07 CPU-s a million rows)
_FIRST_DTYPE = (
    "CASE WHEN coalesce(input_dtypes[1], '') <> '' THEN 0 WHEN input_dtypes IS NULL THEN 4 "
    "WHEN len(input_dtypes) = 0 THEN 1 WHEN input_dtypes[1] IS NULL THEN 2 "
    "ELSE 3 END::TINYINT"
)
_FIRST_DTYPE_LIST = (
    "CASE g.first_dtype WHEN 0 THEN [g.dtype] WHEN 1 THEN []::VARCHAR[] WHEN 2 THEN [NULL::VARCHAR] "
    "WHEN 3 THEN [''] END"
)


def _ops_grain(flop_keys, null_lists=True):
    """The _ops grain; `flop_keys`: also keyed by what flop_rest reads of a row (first_dtype, recompute_flag,
    scalar_operand) and with each group's first step, for flop_rest to be summed from it; `null_lists`: with the flag of
    a null list cell or item (else the runs' reads checked them: reports.sql.rowpass)."""
    keys = ",\n         first_dtype, recompute_flag, scalar_operand" if flop_keys else ""
    first_step = ",\n       arg_min(step, seq) AS first_step" if flop_keys else ""
    made = (
        (
            f",\n             {_FIRST_DTYPE} AS first_dtype, coalesce(recompute, false) AS recompute_flag,"
            f"\n             {_SCALAR_OPERAND} AS scalar_operand"
        )
        if flop_keys
        else ""
    )
    return f"""
SELECT run, run_index, op, phase, flop_kind, is_view, dtype, flops, bytes, process_group, group_size{keys},
       count(*) AS ops, sum(flops) AS flops_sum, sum(bytes) AS bytes_sum,
       sum(CASE WHEN flops_bound THEN flops ELSE 0 END) AS bound_flops,
       sum(CASE WHEN flops_bound THEN 1 ELSE 0 END) AS bound_rows,
       sum(bytes_allocated) AS bytes_allocated, sum(bytes_read) AS bytes_read, sum(bytes_written) AS bytes_written,
       sum(duration_ns) AS duration_ns, sum(coalesce(busy_ns, duration_ns)) AS time_ns, min(seq) AS first_seq,
       count(comm_bytes) AS calls, sum(comm_bytes) AS message_bytes,
       min(CASE WHEN comm_bytes IS NOT NULL THEN seq END) AS comm_first_seq,
       max(bytes_allocated) AS bytes_allocated_max, max(bytes_read) AS bytes_read_max,
       max(bytes_written) AS bytes_written_max, max(duration_ns) AS duration_ns_max,
       max(live_bytes) AS live_bytes_max,
       {"bool_or(null_lists)" if null_lists else "false"} AS null_lists{first_step}
FROM (SELECT *, CASE WHEN is_view OR flop_kind = 'collective' THEN 0 ELSE bytes_read + bytes_written END AS bytes{made}
      FROM _src) AS r
GROUP BY run, run_index, op, phase, flop_kind, is_view, dtype, flops, bytes, process_group, group_size{keys}
"""


def _steps_grain(flop_keys):
    """The _steps grain (with what compare_by_phase and compare_recompute read: each group's first seq and its
    recomputed rows' FLOPs and count); `flop_keys`: with each group's last seq and recompute flag, for flop_steps."""
    flop = ",\n       max(seq) AS last_seq, bool_or(coalesce(recompute, false)) AS recompute" if flop_keys else ""
    return f"""
SELECT run, run_index, step, phase, count(*) AS ops, sum(flops) AS flops, sum(bytes_allocated) AS bytes_allocated,
       sum(duration_ns) AS duration_ns, max(live_bytes) AS live_bytes_peak, min(seq) AS first_seq,
       sum(CASE WHEN recompute THEN flops ELSE 0 END) AS recompute_flops,
       sum(CASE WHEN recompute THEN 1 ELSE 0 END) AS recompute_ops{flop}
FROM _src
GROUP BY run, run_index, step, phase
"""


GRAINS = {
    "_ops": _ops_grain(True),
    "_steps": _steps_grain(True),
}


def _flops_view(name):
    """The body of view `name` of flops.sql (statements separated by a line holding only ';')."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "flops.sql"), encoding="utf-8") as f:
        return re.split(r"^;\s*$", f.read().split(f"CREATE VIEW {name} AS\n", 1)[1], flags=re.MULTILINE)[0].strip()


# flops.sql's flop_ops over the ops of _ops instead of a scan of rows (its packet lists as flops.sql writes them)
_FLOP_OPS = _flops_view("flop_ops").replace(
    "FROM (SELECT DISTINCT run_index, op FROM rows)", "FROM (SELECT DISTINCT run_index, op FROM _ops)"
)

_PCT = (
    """CASE WHEN t.flops = 0 THEN 0.0 ELSE CAST(g.flops AS DOUBLE) * 100.0 / CAST(t.flops AS DOUBLE) END AS flops_pct"""
)
_TIME_PCT = """CASE WHEN t.duration_ns = 0 THEN 0.0
            ELSE g.duration_us * 100.0 / (CAST(t.duration_ns AS DOUBLE) / 1000.0) END AS duration_pct"""

VIEWS = {
    # _steps holds one row per (run, step, phase): count(step) counts views.sql's distinct steps (a DISTINCT
    # aggregate cost DuckDB about 4 ms on any input)
    "phase_steps": """
SELECT run, run_index, phase, count(step) AS steps FROM _steps GROUP BY run, run_index, phase
""",
    # grouped by run_index alone (the run is one per run_index: min): a VARCHAR key cost DuckDB about 1.2 ms a
    # GROUP BY on a small table, and count(DISTINCT) about 4 ms; run_totals is made by every Trace
    "run_totals": """
SELECT s.run, s.run_index, s.ops, s.steps_traced, s.fb_steps, s.flops, s.bytes_allocated, s.duration_ns,
       o.bound_rows, o.flops_max, o.bytes_allocated_max, o.bytes_read_max, o.bytes_written_max, o.duration_ns_max
FROM (SELECT min(run) AS run, run_index, CAST(sum(ops) AS BIGINT) AS ops, count(step) AS steps_traced,
             count(CASE WHEN fb THEN step END) AS fb_steps,
             sum(flops) AS flops, sum(bytes_allocated) AS bytes_allocated, sum(duration_ns) AS duration_ns
      FROM (SELECT min(run) AS run, run_index, step, sum(ops) AS ops, bool_or(phase IN ('forward', 'backward')) AS fb,
                   sum(flops) AS flops, sum(bytes_allocated) AS bytes_allocated, sum(duration_ns) AS duration_ns
            FROM _steps GROUP BY run_index, step) AS t
      GROUP BY run_index) AS s
JOIN (SELECT run_index, sum(bound_rows) AS bound_rows, max(flops) AS flops_max,
             max(bytes_allocated_max) AS bytes_allocated_max, max(bytes_read_max) AS bytes_read_max,
             max(bytes_written_max) AS bytes_written_max, max(duration_ns_max) AS duration_ns_max
      FROM _ops GROUP BY run_index) AS o ON s.run_index = o.run_index
""",
    "op_facts": """
SELECT run, run_index, op, phase, flop_kind, is_view, CAST(sum(ops) AS BIGINT) AS ops, sum(flops_sum) AS flops,
       sum(bound_flops) AS bound_flops, sum(bytes_allocated) AS bytes_allocated, sum(bytes_read) AS bytes_read,
       sum(bytes_written) AS bytes_written, sum(duration_ns) AS duration_ns, min(first_seq) AS first_seq
FROM _ops
GROUP BY run, run_index, op, phase, flop_kind, is_view
""",
    "by_dtype": f"""
SELECT g.run, g.run_index, g.dtype, g.ops, g.flops, {_PCT},
       g.matmul_flops, g.bytes_allocated, g.bytes_read, g.bytes_written, g.duration_us,
       {_TIME_PCT},
       g.first_seq
FROM (SELECT run, run_index, dtype, CAST(sum(ops) AS BIGINT) AS ops, sum(flops_sum) AS flops,
             sum(CASE WHEN flop_kind = 'matmul' THEN flops_sum ELSE 0 END) AS matmul_flops,
             sum(bytes_allocated) AS bytes_allocated, sum(bytes_read) AS bytes_read,
             sum(bytes_written) AS bytes_written, CAST(sum(duration_ns) AS DOUBLE) / 1000.0 AS duration_us,
             min(first_seq) AS first_seq
      FROM _ops GROUP BY run, run_index, dtype) AS g
JOIN run_totals AS t ON g.run_index = t.run_index
""",
    "by_step": """
SELECT run, run_index, step, CAST(sum(ops) AS BIGINT) AS ops, sum(flops) AS flops,
       sum(CASE WHEN phase = 'forward' THEN flops ELSE 0 END) AS flops_forward,
       sum(CASE WHEN phase = 'backward' THEN flops ELSE 0 END) AS flops_backward,
       sum(CASE WHEN phase = 'optimizer' THEN flops ELSE 0 END) AS flops_optimizer,
       sum(CASE WHEN phase = 'other' THEN flops ELSE 0 END) AS flops_other,
       sum(bytes_allocated) AS bytes_allocated, max(live_bytes_peak) AS live_bytes_peak,
       CAST(sum(duration_ns) AS DOUBLE) / 1000.0 AS duration_us
FROM _steps
GROUP BY run, run_index, step
""",
    # the rows at each run's highest live bytes (from _steps): the parts' statistics skip the rest
    "peak": """
SELECT r.run, r.run_index, r.live_bytes AS peak_live_bytes, r.seq, r.step, r.phase, r.module, r.op
FROM _src AS r
JOIN (SELECT run_index, max(live_bytes_peak) AS top FROM _steps GROUP BY run_index) AS m
  ON r.run_index = m.run_index AND r.live_bytes = m.top
QUALIFY row_number() OVER (PARTITION BY r.run_index ORDER BY r.seq) = 1
""",
    "module_own": """
SELECT run, run_index, module, count(*) AS ops, sum(flops) AS flops, sum(bytes_allocated) AS bytes_allocated,
       CAST(sum(duration_ns) AS DOUBLE) / 1000.0 AS duration_us, min(seq) AS first_seq
FROM _src
GROUP BY run, run_index, module
""",
    "roofline_op": """
SELECT run, run_index, op, dtype, phase, CAST(sum(ops) AS BIGINT) AS ops, sum(flops_sum) AS flops,
       sum(bytes_sum) AS bytes, sum(time_ns) AS time_ns, min(first_seq) AS first_seq
FROM _ops
GROUP BY run, run_index, op, dtype, phase
""",
    "roofline_groups": """
SELECT run, run_index, phase, dtype, flops, bytes, CAST(sum(ops) AS BIGINT) AS ops, sum(time_ns) AS time_ns
FROM _ops
GROUP BY run, run_index, phase, dtype, flops, bytes
""",
    # flops.sql's views of the FLOP sections (reports.sql.flops): the ops from _ops, the steps from _steps, and the
    # rows no walk reads (flop_rest) summed from _ops, whose keys hold what flop_marked's `walked` reads of a row
    "flop_ops": _FLOP_OPS,
    "flop_steps": """
SELECT run, run_index, last_seq AS seq, step, phase, recompute FROM _steps
""",
    "flop_rest": f"""
SELECT g.run, g.run_index, min(g.first_seq) AS seq, arg_min(g.first_step, g.first_seq) AS step, g.phase,
       CASE WHEN g.phase = 'optimizer' THEN g.op END AS op, g.flop_kind, sum(g.flops_sum) AS flops,
       g.recompute_flag AS recompute, {_FIRST_DTYPE_LIST} AS first_dtype
FROM _ops AS g
JOIN flop_ops AS o ON g.run_index = o.run_index AND g.op = o.op
WHERE NOT (g.flop_kind IN ('matmul', 'attention') OR (g.flop_kind = 'conv' AND g.phase = 'forward') OR o.copies
           OR (g.phase IN ('backward', 'other') AND (g.flop_kind = 'collective' OR o.hops)) OR o.derives
           OR (o.scales AND g.scalar_operand))
GROUP BY g.run, g.run_index, g.phase, CASE WHEN g.phase = 'optimizer' THEN g.op END, g.flop_kind, g.recompute_flag,
         {_FIRST_DTYPE_LIST}, g.flops > 0
""",
    # compare.sql's views (reports.compare) from the grains: by phase and recompute from _steps, by op and dtypes from
    # _ops (compare_by_module, keyed by module and phase, reads the rows)
    "compare_by_phase": """
SELECT run, run_index, phase AS key, phase, CAST(sum(ops) AS BIGINT) AS ops, sum(flops) AS flops,
       sum(bytes_allocated) AS bytes_allocated, sum(duration_ns) AS duration_ns,
       max(live_bytes_peak) AS peak_live_bytes, min(first_seq) AS first_seq
FROM _steps
GROUP BY run, run_index, phase
""",
    "compare_by_op": """
SELECT run, run_index, op AS key, phase, CAST(sum(ops) AS BIGINT) AS ops, sum(flops_sum) AS flops,
       sum(bytes_allocated) AS bytes_allocated, sum(duration_ns) AS duration_ns,
       max(live_bytes_max) AS peak_live_bytes, min(first_seq) AS first_seq
FROM _ops
GROUP BY run, run_index, op, phase
""",
    "compare_recompute": """
SELECT run, run_index, phase, sum(recompute_flops) AS flops, sum(recompute_ops) AS ops, min(first_seq) AS first_seq
FROM _steps
GROUP BY run, run_index, phase
""",
    "compare_dtypes": """
SELECT run, run_index, op, dtype, CAST(sum(ops) AS BIGINT) AS ops, min(first_seq) AS first_seq
FROM _ops
GROUP BY run, run_index, op, dtype
""",
    "collective_totals": """
SELECT run, run_index, op, process_group, coalesce(group_size, 1) AS group_size, phase,
       CAST(sum(calls) AS BIGINT) AS calls, sum(message_bytes) AS message_bytes, min(comm_first_seq) AS first_seq
FROM _ops
WHERE calls > 0
GROUP BY run, run_index, op, process_group, coalesce(group_size, 1), phase
""",
}


# A trace of several runs (the ranks of a job) reports the FLOP sections of run 0 alone (reports.sql.engine
# first_run), whose flop_rest then reads flops.sql's definition over run 0's rows: the grain's keys for it would be
# made for every run, 2.7 s of a 128-rank, 50M-row trace's 14 s _ops scan and 1.1 s of its 2.5 s _steps scan
# (benchmarks/README.md, stop 30), for views that read 1/128 of them. FLOP_VIEWS: the views read from those keys.
FLOP_VIEWS = ("flop_rest", "flop_steps")


def grains(several, null_lists=True, flop_rest=True):
    """GRAINS for a trace of one run, or of `several`: _ops and _steps without what only FLOP_VIEWS read. Without
    `null_lists`, _ops without the flag of a null list (its rows checked by a read of their own: rowpass); without
    `flop_rest`, without flop_rest's keys (the run's flop_rest kept from that read: reports.sql.flop_rows)."""
    made = {"_ops": _ops_grain(not several and flop_rest, null_lists), "_steps": _steps_grain(not several)}
    return GRAINS if made == GRAINS else made


def views(several, flop_rest=True):
    """VIEWS for a trace of one run, or of `several`: FLOP_VIEWS as flops.sql defines them (without `flop_rest`: that
    view as flops.sql defines it)."""
    left = FLOP_VIEWS if several else () if flop_rest else ("flop_rest",)
    return {name: body for name, body in VIEWS.items() if name not in left}


def source(rows, narrow, null_lists="FALSE"):
    """The statements that make `_src`, what the grains read: a view of `rows` with each row's dtype and whether
    `null_lists` (a condition on the row) holds, or, when `narrow` ([(run name literal, run index, read_parquet of a
    batch of its parts with filename and row numbers)]) is given, the rows read once into a table `_rows` (with
    each row's part file and row number), `rows` redefined over it, and `_src` a view of it: for a trace of many
    small parts, where opening the files costs more than their rows (DuckDB opens every part for every scan, and
    holds every part's reader until a statement ends: hence one statement per batch). Every later query, the
    sections' own included, then reads memory, not 10,000 files."""
    if narrow is None:
        return source_views(rows, False, null_lists)
    out = [f"CREATE TABLE _rows AS SELECT *, '' AS filename, CAST(0 AS BIGINT) AS file_row_number FROM {rows} LIMIT 0"]
    for name, i, read in narrow:
        out.append(
            f"INSERT INTO _rows SELECT {name} AS run, {i} AS run_index, * EXCLUDE (filename, file_row_number), "
            f"filename, file_row_number FROM {read}"
        )
    return out + source_views(rows, True, null_lists)


def source_views(rows, read_once, null_lists):
    """The views of source(): `_src` over `rows`, or with the rows read once (`read_once`) `rows` and `_src` over
    `_rows`."""
    src = f"SELECT *, {_DTYPE} AS dtype, ({null_lists}) AS null_lists FROM"
    if not read_once:
        return [f"CREATE VIEW _src AS {src} {rows}"]
    return [
        f"CREATE OR REPLACE VIEW {rows} AS SELECT * EXCLUDE (filename, file_row_number) FROM _rows",
        f"CREATE VIEW _src AS {src} _rows",
    ]


def files_query(read):
    """Per part file of one run's `read` (a relation with seq, filename and file_row_number), its rows and the least
    and greatest seq - row number."""
    return (
        f"SELECT filename, count(*) AS n, min(seq - file_row_number) AS lo, max(seq - file_row_number) AS hi "
        f"FROM {read} GROUP BY filename"
    )
