"""The meter (`tracer.Meter`): every step's MFU at the cost of tracing one step per shape, its figures, and
its callbacks for training frameworks."""
