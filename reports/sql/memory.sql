-- The memory categories of `optrace report` (reports/memory/sql_categories.py): the rows the storage-lifetime model
-- (reports/memory/lifetimes.py) reads, cut down from every row to those where a storage's life changes.
-- Statements are separated by a line holding only ';' (the format of views.sql).

-- Each mention of a storage id by a row: as an input (side 0) or an output (side 1), with the output's
-- storage bytes where the row pairs its outputs with sizes one to one (lifetimes.py _first_output_bytes).
CREATE VIEW storage_mentions AS
SELECT run_index, seq, 0 AS side, unnest(input_storage_ids) AS storage_id, CAST(NULL AS BIGINT) AS nbytes
FROM rows
UNION ALL
SELECT run_index, seq, 1 AS side, unnest(output_storage_ids) AS storage_id,
       unnest(CASE WHEN len(output_storage_bytes) = len(output_storage_ids) THEN output_storage_bytes
                   ELSE CAST([] AS BIGINT[]) END) AS nbytes
FROM rows
;
-- Per storage: the first row naming it as an input, as an output, and as an output with its size.
CREATE VIEW storage_firsts AS
SELECT run_index, storage_id, min(CASE WHEN side = 0 THEN seq END) AS first_in,
       min(CASE WHEN side = 1 THEN seq END) AS first_out, min(CASE WHEN nbytes >= 0 THEN seq END) AS first_sized
FROM storage_mentions
WHERE storage_id IS NOT NULL
GROUP BY run_index, storage_id
;
-- Each row's seq beside the row before it, and whether a backward begins at it (a backward row after a
-- row of another phase or step: lifetimes.py categories), a collective (lifetimes.py collective_storages)
-- or a row that frees storages.
CREATE VIEW memory_row_facts AS
SELECT run_index, seq, lag(seq) OVER w AS prev_seq,
       phase = 'backward' AND NOT coalesce(lag(phase) OVER w = 'backward' AND lag(step) OVER w = step, false) AS begins,
       starts_with(op, 'c10d.') OR starts_with(op, '_c10d_functional.') OR starts_with(op, '_c10d_functional_autograd.')
         OR coalesce(len(freed_storage_ids), 0) > 0 AS kept
FROM rows
WINDOW w AS (PARTITION BY run_index ORDER BY seq)
;
-- The seqs the lifetime model needs of each run: the first and last rows, the peak, every row where a
-- storage is first named (and the row before a first naming as an input: the rise of live_bytes sizes
-- it), first sized, freed or used by a collective, and each row where a backward begins with the row before.
CREATE VIEW memory_seqs AS
SELECT run_index, seq FROM memory_row_facts WHERE kept OR begins
UNION SELECT run_index, prev_seq FROM memory_row_facts WHERE begins AND prev_seq IS NOT NULL
UNION SELECT run_index, min(seq) FROM rows GROUP BY run_index
UNION SELECT run_index, max(seq) FROM rows GROUP BY run_index
UNION SELECT run_index, seq FROM peak
UNION SELECT run_index, first_in FROM storage_firsts WHERE first_in IS NOT NULL
UNION SELECT run_index, first_out FROM storage_firsts WHERE first_out IS NOT NULL
UNION SELECT run_index, first_sized FROM storage_firsts WHERE first_sized IS NOT NULL
UNION SELECT f.run_index, f.prev_seq
      FROM memory_row_facts AS f JOIN storage_firsts AS s ON f.run_index = s.run_index AND f.seq = s.first_in
      WHERE f.prev_seq IS NOT NULL
;
