-- optrace compare's tables (reports.compare): for each run, per key and
-- phase, the totals that become figures per step (each phase's total over the steps it ran in,
-- view phase_steps), the highest live bytes after an op of the key, and the key's first row.
-- One view per key: phase, op, module (rows without a module have no module key).
-- Statements are separated by a line holding only ';'.

-- portable: compare by phase.
CREATE VIEW compare_by_phase AS
SELECT run, run_index, phase AS key, phase, count(*) AS ops, sum(flops) AS flops,
       sum(bytes_allocated) AS bytes_allocated, sum(duration_ns) AS duration_ns,
       max(live_bytes) AS peak_live_bytes, min(seq) AS first_seq
FROM rows
GROUP BY run, run_index, phase
;
-- portable: compare by op.
CREATE VIEW compare_by_op AS
SELECT run, run_index, op AS key, phase, count(*) AS ops, sum(flops) AS flops,
       sum(bytes_allocated) AS bytes_allocated, sum(duration_ns) AS duration_ns,
       max(live_bytes) AS peak_live_bytes, min(seq) AS first_seq
FROM rows
GROUP BY run, run_index, op, phase
;
-- portable: compare by module (the innermost module of a row).
CREATE VIEW compare_by_module AS
SELECT run, run_index, module AS key, phase, count(*) AS ops, sum(flops) AS flops,
       sum(bytes_allocated) AS bytes_allocated, sum(duration_ns) AS duration_ns,
       max(live_bytes) AS peak_live_bytes, min(seq) AS first_seq
FROM rows
WHERE module IS NOT NULL
GROUP BY run, run_index, module, phase
;
;
-- portable: compare's words on activation checkpointing: per run and phase, the FLOPs of the rows the tracer
-- flagged `recompute` (forward work re-run in the backward).
CREATE VIEW compare_recompute AS
SELECT run, run_index, phase, sum(CASE WHEN recompute THEN flops ELSE 0 END) AS flops,
       sum(CASE WHEN recompute THEN 1 ELSE 0 END) AS ops, min(seq) AS first_seq
FROM rows
GROUP BY run, run_index, phase
;
-- compare's words on dtypes: per run, op and dtype (view row_dtype: a row's first input's dtype, else its first
-- output's), the ops.
CREATE VIEW compare_dtypes AS
SELECT run, run_index, op, dtype, count(*) AS ops, min(seq) AS first_seq
FROM row_dtype
GROUP BY run, run_index, op, dtype
