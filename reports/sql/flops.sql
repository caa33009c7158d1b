-- The FLOP sections of the report (breakdown, explain, MFU: reports/flops) read from three views, which
-- reports.sql.flops joins into one small frame that the pandas functions run on unchanged:
--
--   flop_rows   the rows those functions read one by one, with the columns they read
--   flop_rest   every other row, summed per phase, FLOP kind, recompute flag, first input dtype and
--               whether it has FLOPs (and per op in the optimizer phase, whose op names explain reads)
--   flop_steps  one row per run, step and phase: the steps each phase ran in (what reports.steps
--               divides by) and whether the step re-ran checkpointed work
--
-- The op lists below are reports._util.ONE_TO_ONE_COPIES and reports.flops.walks._GATHERS,
-- _ADDS, GRADIENT_PLACES, _GRADIENT_MOVES, DERIVED and SCALED (tests/reports/sql/test_sql_flops.py checks that they agree).

-- Per run and op: whether its overload packet is a one-to-one copy or a gather (the copy/cast walk from
-- parameters: a cast weight, w[expert_ids]), or an add, an op placing or moving a gradient (the gradient walk).
-- Decided once per distinct op, not per row.
CREATE VIEW flop_ops AS
SELECT run_index, op,
       packet IN ('aten.clone', 'aten.copy_', 'aten.copy', 'aten._to_copy', 'aten._to_dtype', 'aten._copy_from',
                  'aten._copy_from_and_resize', 'aten.lift_fresh_copy', 'aten.to', 'aten.type_as',
                  'aten.contiguous',
                  'aten.index', 'aten.index_select', 'aten._unsafe_index') AS copies,
       packet IN ('aten.add', 'aten.add_',
                  'aten.slice_backward', 'aten.select_backward', 'aten.index_put', 'aten.index_put_',
                  'aten._index_put_impl_', 'aten.index_add', 'aten.index_add_', 'aten.cat', 'aten.stack',
                  'aten.slice_scatter', 'aten.select_scatter', 'aten.as_strided_scatter',
                  'fsdp.chunk_cat', 'aten._chunk_cat') AS hops,
       packet IN ('aten._weight_norm_interface', 'aten._weight_norm') AS derives,
       packet IN ('aten.mul', 'aten.div') AS scales
FROM (SELECT run_index, op, split_part(op, '.', 1) || '.' || split_part(op, '.', 2) AS packet
      FROM (SELECT DISTINCT run_index, op FROM rows) AS d) AS p
;
-- The rows the walks of reports.flops.roles.Roles read, and the rows explain and MFU read cell by cell:
--   matmul and attention rows       every matmul is sorted into weight, weight outside the model or attention;
--                                   fused attention kernels (their shapes: the score recomputation, causal)
--   forward convolutions            explain names their weights (ids and shapes)
--   one-to-one copies and gathers   the copy/cast walk from parameters, in every phase, and the weights
--                                   parametrizations compute: _weight_norm, a tensor times or over a scalar
--   backward/other adds, copies, ops placing or moving a gradient, collectives: the gradient walk
-- Every other row is an elementwise, reduction, norm, softmax, optimizer or view op that no walk follows
-- and whose category is "other": the sections only sum its FLOPs, which flop_rest keeps.
-- A scalar input is a shape whose sizes multiply to 1: sizes being >= 0, each is 1 or there is none, so its least and
-- greatest sizes are 1 or NULL (list_min and list_max, which are array_min and array_max in Spark and Trino, where
-- DuckDB's list_product has no counterpart).
CREATE VIEW flop_marked AS
SELECT r.*, o.scales,
       r.flop_kind IN ('matmul', 'attention') OR (r.flop_kind = 'conv' AND r.phase = 'forward') OR o.copies
       OR (r.phase IN ('backward', 'other') AND (r.flop_kind = 'collective' OR o.hops)) OR o.derives
       OR (o.scales AND (array_length(r.input_storage_ids) = 1 OR array_length(r.input_storage_ids) = 2
                         AND (coalesce(list_min(r.input_shapes[1]), 1) = 1
                                 AND coalesce(list_max(r.input_shapes[1]), 1) = 1
                              OR coalesce(list_min(r.input_shapes[2]), 1) = 1
                                 AND coalesce(list_max(r.input_shapes[2]), 1) = 1))) AS walked
FROM rows AS r
JOIN flop_ops AS o ON r.run_index = o.run_index AND r.op = o.op
;
-- The walked rows, with only what is read of them: the module of matmul rows (the output head) and of attention
-- kernels (explain names where a kernel was causal), the first two
-- input dtypes (the multiplied operand of addmm is the second: MFU's dtype), input shapes of attention kernels,
-- convolutions and the scaled tensors (which input is the scalar), output shapes of matmuls (a weight gradient that never becomes a .grad) and convolutions,
-- whether a matmul's FLOPs are an upper bound (explain: N_active measured from bounds) and the grad mode (explain: a
-- forward under no_grad is an evaluation).
CREATE VIEW flop_rows AS
SELECT run, run_index, seq, step, phase, op, CASE WHEN flop_kind IN ('matmul', 'attention') THEN module END AS module,
       flop_kind,
       flops, coalesce(recompute, false) AS recompute, causal, input_storage_ids, output_storage_ids,
       array_slice(input_dtypes, 1, 2) AS input_dtypes,
       CASE WHEN flop_kind IN ('attention', 'conv') OR scales THEN input_shapes END AS input_shapes,
       CASE WHEN flop_kind IN ('matmul', 'conv') THEN output_shapes END AS output_shapes,
       CASE WHEN flop_kind = 'matmul' THEN coalesce(flops_bound, false) END AS flops_bound, grad_mode
FROM flop_marked
WHERE walked
;
-- The other rows summed. Each group stands where its first row stood (seq, step), so that a key is
-- first seen where it was first seen in the rows; input_dtypes keeps the first input's dtype (the multiplied one:
-- addmm, whose first input is added, is a matmul row); flops > 0 apart, so the first row with FLOPs of a dtype
-- is where it was.
CREATE VIEW flop_rest AS
SELECT run, run_index, min(seq) AS seq, min_by(step, seq) AS step, phase,
       CASE WHEN phase = 'optimizer' THEN op END AS op, flop_kind, sum(flops) AS flops, recompute, first_dtype
FROM (SELECT run, run_index, seq, step, phase, op, flop_kind, flops, coalesce(recompute, false) AS recompute,
             array_slice(input_dtypes, 1, 1) AS first_dtype
      FROM flop_marked WHERE NOT walked) AS r
GROUP BY run, run_index, phase, CASE WHEN phase = 'optimizer' THEN op END, flop_kind, recompute, first_dtype, flops > 0
;
-- MFU alone (reports.sql.flops frame(trace, mfu_only=True)) walks no role: it reads the matmul and attention rows
-- one by one (their dtype, fused attention's shapes) and every other row's FLOPs summed, as flop_rest sums them.
CREATE VIEW mfu_marked AS
SELECT *, flop_kind IN ('matmul', 'attention') AS walked FROM rows
;
-- One row per run, step and phase, with whether any of its rows re-ran checkpointed work.
CREATE VIEW flop_steps AS
SELECT run, run_index, max(seq) AS seq, step, phase, bool_or(coalesce(recompute, false)) AS recompute
FROM rows
GROUP BY run, run_index, step, phase
;
