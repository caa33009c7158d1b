"""The pandas implementation of the report's top ops (reports.sql.tables.top_ops), kept as its test oracle
(tests/reports/sql/test_sql.py)."""

__all__ = ["top_ops"]


def top_ops(df, top):
    """The `top` ops by FLOPs (reports.tables.by_op's order), their figures per step (reports.steps.per_step):
    op, ops_per_step, flops_per_step, flops_pct, bytes_allocated_per_step."""
    import pandas as pd

    from reports.steps import per_step, step_phases
    from tests.oracles.tables import by_op

    ops = by_op(df).head(top)
    phases = step_phases(df)
    values = {"ops_per_step": pd.Series(1, index=df.index), "flops_per_step": df["flops"],
              "bytes_allocated_per_step": df["bytes_allocated"]}  # fmt: skip
    figures = {name: per_step(df, values=v, by="op", phases=phases) for name, v in values.items()}
    op = ops["op"].astype(object)
    out = pd.DataFrame({"op": op, **{name: op.map(f).astype("float64") for name, f in figures.items()}})
    out.insert(3, "flops_pct", ops["flops_pct"])
    return out.reset_index(drop=True)
