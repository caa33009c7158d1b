-- The distributed sections of `optrace report` (reports.distributed.sql_ranks): each rank's time, FLOPs and
-- traffic per phase, its steps' wall time and its collectives, over `rows` of every rank (one run per rank).
-- Statements are separated by a line holding only ';' (the format of views.sql).

-- portable: per run, step and phase: ops, FLOPs, collective bytes and time, the other ops' time, all ops'
-- time, and the span of its ops (first start, last end, in ns as float64: reports.distributed.ranks
-- _step_times). One scan of the rows gives both the per-step figures of ranks and imbalance (its sums
-- per phase, divided by phase_steps) and the steps' wall times (its spans per step). A collective row is
-- one with a comm_bytes value.
CREATE VIEW rank_step_phase AS
SELECT run, run_index, step, phase, count(*) AS ops, sum(flops) AS flops,
       sum(CASE WHEN comm_bytes IS NOT NULL THEN comm_bytes ELSE 0 END) AS comm_bytes,
       sum(CASE WHEN comm_bytes IS NOT NULL THEN 1 ELSE 0 END) AS comm_ops,
       sum(CASE WHEN comm_bytes IS NOT NULL THEN duration_ns ELSE 0 END) AS comm_ns,
       sum(CASE WHEN comm_bytes IS NULL THEN duration_ns ELSE 0 END) AS compute_ns,
       sum(duration_ns) AS duration_ns, min(seq) AS first_seq,
       min(CAST(start_ns AS DOUBLE)) AS start_ns, max(CAST(start_ns AS DOUBLE) + CAST(duration_ns AS DOUBLE)) AS end_ns
FROM rows
GROUP BY run, run_index, step, phase
;
-- portable: the collectives of each run by op, group and message size: calls, summed time and the first
-- call's seq (reports.distributed.collectives collectives).
CREATE VIEW collective_calls AS
SELECT run, run_index, op, process_group, group_size, comm_bytes, count(*) AS calls, sum(duration_ns) AS total_ns,
       min(seq) AS first_seq
FROM rows
WHERE comm_bytes IS NOT NULL
GROUP BY run, run_index, op, process_group, group_size, comm_bytes
;
