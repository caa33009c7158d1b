"""optrace's tracer: record every aten op of a training step to a Parquet trace.

Imports are lazy so that `reports` can read the trace schema without loading torch.
"""

__all__ = [
    "Meter",
    "MeterCallback",
    "Tracer",
    "TraceError",
    "matmul_ceiling",
    "memory_bandwidth",
    "read_metadata",
    "register_flop_formula",
    "time_matmul",
    "time_step",
]

_HOME = {
    "Tracer": "tracer.recording.mode",
    "Meter": "tracer.metering.meter",
    "MeterCallback": "tracer.metering.callbacks",
    "TraceError": "tracer.errors",
    "register_flop_formula": "tracer.flops.formulas",
    "read_metadata": "tracer.schema",
    "time_step": "tracer.measure",
    "time_matmul": "tracer.measure",
    "matmul_ceiling": "tracer.measure",
    "memory_bandwidth": "tracer.bandwidth",
}


def __getattr__(name):
    if name not in _HOME:
        raise AttributeError(f"module 'tracer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_HOME[name]), name)


def __dir__():
    return sorted(__all__)
