"""Recording: the dispatch mode behind `tracer.Tracer` and what it reads for each op (phase, module, step,
storages, timing), the run metadata it writes, and the ops it records whole (higher-order ops, collectives)."""
