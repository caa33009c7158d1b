-- The distributed sections of `optrace report` (reports/sql/distributed.py): each rank's time, FLOPs and
-- traffic per phase, its steps' wall time and its collectives, over `rows` of every rank (one run per rank).
-- Statements are separated by a line holding only ';' (the format of views.sql).

-- portable: per run and phase: FLOPs, collective bytes and time, the other ops' time and all ops' time
-- (reports/distributed/ranks.py ranks and imbalance divide them by phase_steps). A collective row is one
-- with a comm_bytes value.
CREATE VIEW rank_phase_totals AS
SELECT run, run_index, phase, count(*) AS ops, sum(flops) AS flops,
       sum(CASE WHEN comm_bytes IS NOT NULL THEN comm_bytes ELSE 0 END) AS comm_bytes,
       sum(CASE WHEN comm_bytes IS NOT NULL THEN duration_ns ELSE 0 END) AS comm_ns,
       sum(CASE WHEN comm_bytes IS NULL THEN duration_ns ELSE 0 END) AS compute_ns,
       sum(duration_ns) AS duration_ns, min(seq) AS first_seq
FROM rows
GROUP BY run, run_index, phase
;
-- portable: each step's span per run: its first op's start and its last op's end, in ns as float64
-- (reports/distributed/ranks.py _step_times).
CREATE VIEW step_spans AS
SELECT run, run_index, step, min(CAST(start_ns AS DOUBLE)) AS start_ns,
       max(CAST(start_ns AS DOUBLE) + CAST(duration_ns AS DOUBLE)) AS end_ns
FROM rows
GROUP BY run, run_index, step
;
-- portable: the collectives of each run by op, group and message size: calls, summed time and the first
-- call's seq (reports/distributed/collectives.py collectives).
CREATE VIEW collective_calls AS
SELECT run, run_index, op, process_group, group_size, comm_bytes, count(*) AS calls, sum(duration_ns) AS total_ns,
       min(seq) AS first_seq
FROM rows
WHERE comm_bytes IS NOT NULL
GROUP BY run, run_index, op, process_group, group_size, comm_bytes
;
