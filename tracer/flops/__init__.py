"""FLOP formulas: the registry, the formulas of composite, grouped and pooling ops, odd layouts, and the rule
that says how each aten op is counted (the compiled hook's twin of the common formulas is
tracer/native/_native_flops.cpp)."""
