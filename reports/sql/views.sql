-- optrace's report tables as SQL views over one view `rows`.
--
-- `rows` is the trace: every column of the trace schema (docs/schema.md), one row per
-- aten op, plus `run` (the run's name) and `run_index` (0, 1, ... in the order the runs were given;
-- one per rank of a distributed trace). reports.sql.engine defines it over the literal list of
-- part files the integrity checks accepted:
--
--   CREATE VIEW rows AS
--   SELECT 'gpt' AS run, 0 AS run_index, * FROM read_parquet(['runs/gpt.parquet/part-000000.parquet', ...]);
--
-- Each statement below is plain SQL: a view per report table, grouping and summing. What stays
-- in Python (reports.sql.engine) is the shaping pandas needs: column dtypes, the sum over the
-- phases of a per-step figure (in phase order, so the floating-point result matches reports.steps),
-- the module tree's roll-up and the roofs of the roofline (device tables).
--
-- Per step: a figure per training step is, for each phase, the phase's total divided by the
-- number of distinct steps that phase ran in (view phase_steps), summed over the phases.
--
-- Dialect: DuckDB's, in spellings sqlglot writes in Spark SQL's and Trino's (reports.sql.dialects.views;
-- docs/sql_dialects.md), so the same views run over the same Parquet files on a cluster: a list's item
-- `input_dtypes[1]`, its length `array_length(x)`, a slice `array_slice(x, 1, 2)`, its least and greatest
-- items `list_min(x)`, `list_max(x)` (a function sqlglot does not know, such as list_product, is refused
-- there). tests/reports/sql/test_dialects.py runs every view in Spark. The views marked "portable" use no list
-- function and run unchanged in polars' SQL too (tests/reports/sql/test_sql.py checks them).
-- Statements are separated by a line holding only ';'.

-- portable: the steps each phase of each run ran in (reports.steps.phase_steps).
CREATE VIEW phase_steps AS
SELECT run, run_index, phase, count(DISTINCT step) AS steps
FROM rows
GROUP BY run, run_index, phase
;
-- portable: one row per run: ops, steps traced, the training steps (steps with forward or backward
-- ops, else all steps: reports.steps.count_steps), the totals every percentage divides by, the
-- bound rows, and the extremes of the summed columns (an int64 sum that could wrap is taken as
-- float64, reports.steps.summable).
CREATE VIEW run_totals AS
SELECT run, run_index, count(*) AS ops,
       count(DISTINCT step) AS steps_traced,
       count(DISTINCT CASE WHEN phase IN ('forward', 'backward') THEN step END) AS fb_steps,
       sum(flops) AS flops, sum(bytes_allocated) AS bytes_allocated, sum(duration_ns) AS duration_ns,
       sum(CASE WHEN flops_bound THEN 1 ELSE 0 END) AS bound_rows,
       max(flops) AS flops_max, max(bytes_allocated) AS bytes_allocated_max, max(bytes_read) AS bytes_read_max,
       max(bytes_written) AS bytes_written_max, max(duration_ns) AS duration_ns_max
FROM rows
GROUP BY run, run_index
;
-- portable: the totals of each op, phase, FLOP kind and view flag: the tables by phase, by op, of
-- uncounted ops, of top ops per step and of views and copies sum these (reports.sql.engine
-- computes it once per trace: one scan of the rows for all of them).
CREATE VIEW op_facts AS
SELECT run, run_index, op, phase, flop_kind, is_view, count(*) AS ops, sum(flops) AS flops,
       sum(CASE WHEN flops_bound THEN flops ELSE 0 END) AS bound_flops, sum(bytes_allocated) AS bytes_allocated,
       sum(bytes_read) AS bytes_read, sum(bytes_written) AS bytes_written, sum(duration_ns) AS duration_ns,
       min(seq) AS first_seq
FROM rows
GROUP BY run, run_index, op, phase, flop_kind, is_view
;
-- portable: totals per run and phase: the per-step figures of the summary (FLOPs per phase, the
-- bound FLOPs, ops) divide these by phase_steps.
CREATE VIEW phase_totals AS
SELECT run, run_index, phase, sum(ops) AS ops, sum(flops) AS flops, sum(bound_flops) AS bound_flops,
       sum(bytes_allocated) AS bytes_allocated
FROM op_facts
GROUP BY run, run_index, phase
;
-- portable: reports.by_phase (rows ordered by the phase order forward, backward, optimizer, other).
CREATE VIEW by_phase AS
SELECT g.run, g.run_index, g.phase, g.ops, g.flops,
       CASE WHEN t.flops = 0 THEN 0.0 ELSE CAST(g.flops AS DOUBLE) * 100.0 / CAST(t.flops AS DOUBLE) END AS flops_pct,
       g.bytes_allocated, g.bytes_read, g.bytes_written, g.duration_us,
       CASE WHEN t.duration_ns = 0 THEN 0.0
            ELSE g.duration_us * 100.0 / (CAST(t.duration_ns AS DOUBLE) / 1000.0) END AS duration_pct,
       CASE g.phase WHEN 'forward' THEN 0 WHEN 'backward' THEN 1 WHEN 'optimizer' THEN 2 WHEN 'other' THEN 3
            ELSE 4 END AS phase_order,
       g.first_seq
FROM (SELECT run, run_index, phase, sum(ops) AS ops, sum(flops) AS flops, sum(bytes_allocated) AS bytes_allocated,
             sum(bytes_read) AS bytes_read, sum(bytes_written) AS bytes_written,
             CAST(sum(duration_ns) AS DOUBLE) / 1000.0 AS duration_us, min(first_seq) AS first_seq
      FROM op_facts GROUP BY run, run_index, phase) AS g
JOIN run_totals AS t ON g.run_index = t.run_index
;
-- reports.by_op: flop_kind is the op's kind in its first row (min_by: DuckDB, Spark and Trino).
CREATE VIEW by_op AS
SELECT g.run, g.run_index, g.op, g.flop_kind, g.ops, g.flops,
       CASE WHEN t.flops = 0 THEN 0.0 ELSE CAST(g.flops AS DOUBLE) * 100.0 / CAST(t.flops AS DOUBLE) END AS flops_pct,
       g.bytes_allocated, g.bytes_read, g.bytes_written, g.duration_us,
       CASE WHEN t.duration_ns = 0 THEN 0.0
            ELSE g.duration_us * 100.0 / (CAST(t.duration_ns AS DOUBLE) / 1000.0) END AS duration_pct,
       g.first_seq
FROM (SELECT run, run_index, op, min_by(flop_kind, first_seq) AS flop_kind, sum(ops) AS ops, sum(flops) AS flops,
             sum(bytes_allocated) AS bytes_allocated, sum(bytes_read) AS bytes_read,
             sum(bytes_written) AS bytes_written, CAST(sum(duration_ns) AS DOUBLE) / 1000.0 AS duration_us,
             min(first_seq) AS first_seq
      FROM op_facts GROUP BY run, run_index, op) AS g
JOIN run_totals AS t ON g.run_index = t.run_index
;
-- A row's dtype: its first tensor input's, else its first output's, else '' (reports.tables.row_dtypes).
CREATE VIEW row_dtype AS
SELECT *, CASE WHEN coalesce(input_dtypes[1], '') <> '' THEN input_dtypes[1]
               ELSE coalesce(output_dtypes[1], '') END AS dtype
FROM rows
;
-- reports.by_dtype: matmul_flops are the FLOPs of the matmul rows.
CREATE VIEW by_dtype AS
SELECT g.run, g.run_index, g.dtype, g.ops, g.flops,
       CASE WHEN t.flops = 0 THEN 0.0 ELSE CAST(g.flops AS DOUBLE) * 100.0 / CAST(t.flops AS DOUBLE) END AS flops_pct,
       g.matmul_flops, g.bytes_allocated, g.bytes_read, g.bytes_written, g.duration_us,
       CASE WHEN t.duration_ns = 0 THEN 0.0
            ELSE g.duration_us * 100.0 / (CAST(t.duration_ns AS DOUBLE) / 1000.0) END AS duration_pct,
       g.first_seq
FROM (SELECT run, run_index, dtype, count(*) AS ops, sum(flops) AS flops,
             sum(CASE WHEN flop_kind = 'matmul' THEN flops ELSE 0 END) AS matmul_flops,
             sum(bytes_allocated) AS bytes_allocated, sum(bytes_read) AS bytes_read,
             sum(bytes_written) AS bytes_written, CAST(sum(duration_ns) AS DOUBLE) / 1000.0 AS duration_us,
             min(seq) AS first_seq
      FROM row_dtype GROUP BY run, run_index, dtype) AS g
JOIN run_totals AS t ON g.run_index = t.run_index
;
-- portable: reports.by_step, one row per run and step.
CREATE VIEW by_step AS
SELECT run, run_index, step, count(*) AS ops, sum(flops) AS flops,
       sum(CASE WHEN phase = 'forward' THEN flops ELSE 0 END) AS flops_forward,
       sum(CASE WHEN phase = 'backward' THEN flops ELSE 0 END) AS flops_backward,
       sum(CASE WHEN phase = 'optimizer' THEN flops ELSE 0 END) AS flops_optimizer,
       sum(CASE WHEN phase = 'other' THEN flops ELSE 0 END) AS flops_other,
       sum(bytes_allocated) AS bytes_allocated, max(live_bytes) AS live_bytes_peak,
       CAST(sum(duration_ns) AS DOUBLE) / 1000.0 AS duration_us
FROM rows
GROUP BY run, run_index, step
;
-- portable: each module's own ops (the innermost module of a row); reports.by_module adds the
-- subtrees up the dotted names (reports.tables.by_module).
CREATE VIEW module_own AS
SELECT run, run_index, module, count(*) AS ops, sum(flops) AS flops, sum(bytes_allocated) AS bytes_allocated,
       CAST(sum(duration_ns) AS DOUBLE) / 1000.0 AS duration_us, min(seq) AS first_seq
FROM rows
GROUP BY run, run_index, module
;
-- portable: reports.uncounted, the ops no FLOP formula counted (flop_kind 'unknown').
CREATE VIEW uncounted AS
SELECT g.run, g.run_index, g.op, g.ops, CAST(g.duration_ns AS DOUBLE) / 1000.0 AS duration_us,
       CASE WHEN t.duration_ns = 0 THEN 0.0
            ELSE CAST(g.duration_ns AS DOUBLE) * 100.0 / CAST(t.duration_ns AS DOUBLE) END AS time_pct
FROM (SELECT run, run_index, op, sum(ops) AS ops, sum(duration_ns) AS duration_ns
      FROM op_facts WHERE flop_kind = 'unknown' GROUP BY run, run_index, op) AS g
JOIN run_totals AS t ON g.run_index = t.run_index
;
-- portable: per op and phase, the totals the per-step top-ops table divides by phase_steps.
CREATE VIEW op_phase_totals AS
SELECT run, run_index, op, phase, sum(ops) AS ops, sum(flops) AS flops, sum(bytes_allocated) AS bytes_allocated,
       min(first_seq) AS first_seq
FROM op_facts
GROUP BY run, run_index, op, phase
;
-- portable: reports.peak, the row after which live_bytes is highest (the first, on a tie).
CREATE VIEW peak AS
SELECT r.run, r.run_index, r.live_bytes AS peak_live_bytes, r.seq, r.step, r.phase, r.module, r.op
FROM rows AS r
JOIN (SELECT run_index, max(live_bytes) AS top FROM rows GROUP BY run_index) AS m
  ON r.run_index = m.run_index AND r.live_bytes = m.top
JOIN (SELECT s.run_index, min(s.seq) AS seq
      FROM rows AS s JOIN (SELECT run_index, max(live_bytes) AS top FROM rows GROUP BY run_index) AS n
        ON s.run_index = n.run_index AND s.live_bytes = n.top
      GROUP BY s.run_index) AS f
  ON r.run_index = f.run_index AND r.seq = f.seq
;
-- reports.views: views (is_view) against copies (the copy ops of reports._util.is_copy: an op
-- whose overload packet is one of them, or ends in `_copy` / `_copy_`). The kind is decided once per
-- op, not per row.
CREATE VIEW op_kinds AS
SELECT run, run_index, op, kind, sum(ops) AS ops, sum(bytes_allocated) AS bytes_allocated,
       sum(bytes_written) AS bytes_written, min(first_seq) AS first_seq
FROM (SELECT *, CASE WHEN is_view THEN 'view'
                     WHEN packet IN ('aten.clone', 'aten.copy_', 'aten.copy', 'aten._to_copy', 'aten._to_dtype',
                                     'aten._copy_from', 'aten._copy_from_and_resize', 'aten.lift_fresh_copy', 'aten.to', 'aten.type_as',
                  'aten.contiguous',
                                     'aten.cat', 'aten.stack', 'aten.repeat')
                          OR regexp_replace(packet, '_+$', '') LIKE '%\_copy' ESCAPE '\' THEN 'copy'
                     ELSE '' END AS kind
      FROM (SELECT run, run_index, op, is_view, split_part(op, '.', 1) || '.' || split_part(op, '.', 2) AS packet,
                   sum(ops) AS ops, sum(bytes_allocated) AS bytes_allocated, sum(bytes_written) AS bytes_written,
                   min(first_seq) AS first_seq
            FROM op_facts GROUP BY run, run_index, op, is_view) AS g) AS k
GROUP BY run, run_index, op, kind
;
CREATE VIEW views AS
SELECT g.run, g.run_index, g.kind, g.op, g.ops, g.bytes_allocated, g.bytes_written,
       CASE WHEN t.bytes_allocated = 0 THEN 0.0
            ELSE CAST(g.bytes_allocated AS DOUBLE) * 100.0 / CAST(t.bytes_allocated AS DOUBLE) END AS allocated_pct,
       g.first_seq
FROM op_kinds AS g
JOIN run_totals AS t ON g.run_index = t.run_index
WHERE g.kind <> ''
;
-- The roofline's rows: per op, dtype and phase, FLOPs, algorithmic bytes (views move none, nor do collectives here:
-- their time is the network's and the wait for other ranks, under no roof of the device; collective_totals
-- has their traffic) and time
-- (busy_ns, else duration_ns), with the row's module and input shapes (the tables by module and by shape);
-- reports.time.roofline adds the roofs, per op kind (the tables, whose per-phase totals it divides by
-- phase_steps) and per bound and step (the split).
CREATE VIEW roofline_rows AS
SELECT run, run_index, op, dtype, phase, flops,
       CASE WHEN is_view OR flop_kind = 'collective' THEN 0 ELSE bytes_read + bytes_written END AS bytes,
       coalesce(busy_ns, duration_ns) AS time_ns,
       CAST(coalesce(busy_ns, duration_ns) AS DOUBLE) / 1e9 AS time_s, seq, module, input_shapes
FROM row_dtype
;
-- reports.roofline(by="op"): per op, dtype and phase.
CREATE VIEW roofline_op AS
SELECT run, run_index, op, dtype, phase, count(*) AS ops, sum(flops) AS flops, sum(bytes) AS bytes,
       sum(time_ns) AS time_ns, min(seq) AS first_seq
FROM roofline_rows
GROUP BY run, run_index, op, dtype, phase
;
-- reports.roofline(by="shape"): per op, dtype, input shapes (reports.time.roofline writes them as text) and phase.
CREATE VIEW roofline_shape AS
SELECT run, run_index, op, dtype, input_shapes, phase, count(*) AS ops, sum(flops) AS flops, sum(bytes) AS bytes,
       sum(time_ns) AS time_ns, min(seq) AS first_seq
FROM roofline_rows
GROUP BY run, run_index, op, dtype, input_shapes, phase
;
-- reports.roofline(by="module"): per innermost module (a row without one is in no group) and phase; the module's
-- dtype is that of its heaviest row (most FLOPs, bytes breaking ties; the first such row), whose roof it gets.
CREATE VIEW roofline_module AS
SELECT g.run, g.run_index, g.module, h.dtype, g.phase, g.ops, g.flops, g.bytes, g.time_ns, g.first_seq
FROM (SELECT run, run_index, module, phase, count(*) AS ops, sum(flops) AS flops, sum(bytes) AS bytes,
             sum(time_ns) AS time_ns, min(seq) AS first_seq
      FROM roofline_rows WHERE module IS NOT NULL GROUP BY run, run_index, module, phase) AS g
JOIN (SELECT run_index, module, dtype
      FROM (SELECT run_index, module, dtype,
                   row_number() OVER (PARTITION BY run_index, module
                                      ORDER BY CASE WHEN flops > 0 THEN CAST(flops AS DOUBLE) ELSE 0.0 END * 1e3
                                               + CAST(bytes AS DOUBLE) * 1e-9 DESC, seq) AS heaviest
            FROM roofline_rows WHERE module IS NOT NULL) AS w
      WHERE heaviest = 1) AS h
  ON g.run_index = h.run_index AND g.module = h.module
;
-- reports.roofline_split: the rows per run, phase, dtype, FLOPs and bytes of a row, and their time: every row of a
-- group has one bound and one roof (reports.time.roofline.split_of_groups).
CREATE VIEW roofline_groups AS
SELECT run, run_index, phase, dtype, flops, bytes, count(*) AS ops, sum(time_ns) AS time_ns
FROM roofline_rows
GROUP BY run, run_index, phase, dtype, flops, bytes
;
-- portable: collective traffic per run, collective op, process group and group size, per phase:
-- reports.distributed.collectives.per_step_traffic divides by phase_steps and applies the ring algorithm's
-- factors.
CREATE VIEW collective_totals AS
SELECT run, run_index, op, process_group, coalesce(group_size, 1) AS group_size, phase, count(*) AS calls,
       sum(comm_bytes) AS message_bytes, min(seq) AS first_seq
FROM rows
WHERE comm_bytes IS NOT NULL
GROUP BY run, run_index, op, process_group, coalesce(group_size, 1), phase
;
-- portable: reports.comm_split, per run and step: the time of the ops that are not collectives (compute_s) and of
-- the collectives (comm_s: the rows with comm_bytes), their bytes, and comm_s's share of the two (NULL when both
-- are 0).
CREATE VIEW comm_split AS
SELECT run, run_index, step, compute_s, comm_s, comm_bytes,
       CASE WHEN compute_s + comm_s > 0 THEN 100.0 * comm_s / (compute_s + comm_s) END AS comm_pct
FROM (SELECT run, run_index, step,
             CAST(sum(CASE WHEN comm_bytes IS NULL THEN duration_ns ELSE 0 END) AS DOUBLE) / 1e9 AS compute_s,
             CAST(sum(CASE WHEN comm_bytes IS NULL THEN 0 ELSE duration_ns END) AS DOUBLE) / 1e9 AS comm_s,
             sum(coalesce(comm_bytes, 0)) AS comm_bytes
      FROM rows
      GROUP BY run, run_index, step) AS g
;
