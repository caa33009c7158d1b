"""What the `optrace` commands (reports.output.cli) read of a trace: the columns `report` loads, the Trace of every
rank (reports.sql.engine.Trace) or, for a trace it does not read from its files, the views over its loaded rows, what
report's and compare's reads of the rows keep for their sections, and the first rank's rows for plots."""

import warnings

# Columns no section of `optrace report` reads, left out of its load (a section that needs one takes it out of here).
_REPORT_UNUSED = ("layout", "device", "inplace")
# ... and those only the rank figures read: left out for a trace of one rank.
_RANKS_ONLY = ("start_ns", "comm_bytes", "group_size", "process_group")
# ... of which one rank's own job section (reports.output.distributed.print_job) reads these.
_JOB_COLUMNS = ("comm_bytes", "group_size", "process_group")


def loaded_trace(paths, columns):
    """A Trace over the rows of `paths` loaded with reports.load (`columns`): the views of a trace the Trace does not
    read from its files, and `--engine pandas`, whose loader checks the rows (reports.sql.frame)."""
    from reports.loading.load import load
    from reports.sql.frame import memory_trace

    return memory_trace(load(paths, columns=columns, lists="arrow"), "report", [], columns, grains=True)


def frame_columns(path, plot):
    """The columns `optrace report` loads of the trace at `path` (with `plot`: --plot's)."""
    from reports.loading.load import rank_paths
    from tracer.schema import COLUMN_NAMES

    unused = _REPORT_UNUSED  # --json holds every section too
    if len(rank_paths(path)) <= 1 and not plot:
        unused += tuple(c for c in _RANKS_ONLY if c not in _JOB_COLUMNS)
    return [c for c in COLUMN_NAMES if c not in unused]


def sql_all(path, columns, keep=(), every_run=False):
    """The SQL engine's Trace of every rank of the trace (one run per rank), checked and warned about as
    reports.load does (damage named in the words of a load of `columns`: the pandas engine's); None for a trace
    it does not read (v1, v2: the frame's sections then). `keep`: what its read of rank 0's rows keeps for the
    sections (reports.sql.engine.Trace), of every run's with `every_run`."""
    from reports.sql.engine import Trace, Unsupported

    try:
        return Trace(path, columns=columns, keep=keep() if callable(keep) else keep, every_run=every_run)
    except Unsupported:
        return None


def report_keep():
    """What the report's FLOP and memory sections, its by-module table, its peak and its _steps and _ops grains read of
    rank 0's rows, kept from the Trace's read of its parts."""
    from reports.memory.row_scan import Scan
    from reports.sql.flop_rows import FlopRows
    from reports.sql.kept_ops import Ops
    from reports.sql.kept_views import ModuleOwn, Peak, Steps

    return (FlopRows, Scan, ModuleOwn, Peak, Steps, Ops)


def compare_keep():
    """What compare's memory categories and its _steps and _ops grains read of each run's rows (reports.compare
    figures), kept from the Trace's read of its parts: no run's rows scanned again for them."""
    from reports.memory.row_scan import Scan
    from reports.sql.kept_ops import Ops
    from reports.sql.kept_views import Steps

    return (Scan, Steps, Ops)


def first_rank_frame(path, everyone):
    """The first rank's rows (for plots) as reports.load of the whole trace names them (run `<name>/rank=R`, a
    `rank` column), without reading the other ranks' rows; `everyone` (a Trace of all ranks) has checked and warned."""
    from reports.loading.columns import SharedRuns
    from reports.loading.load import load, runs_with_ranks

    (first, rank), *_ = runs_with_ranks([path])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said once, by `everyone`
        df = load(first, lists="arrow")
    if rank is None:
        return df
    (loaded, meta), (name, _) = next(iter(df.attrs["runs"].items())), next(iter(everyone.runs.items()))
    if loaded != name:
        df["run"] = df["run"].cat.rename_categories([name])
        df.attrs["runs"] = SharedRuns({name: meta})
    if "rank" in df.columns:
        df["rank"] = int(rank)
    else:
        df.insert(1, "rank", int(rank))
    return df
