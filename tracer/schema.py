"""Trace schema v4: column names, Arrow types, named row constants and the metadata key.

This module is the contract between `tracer` (which writes traces) and
`reports` (which reads them). It imports pyarrow only, never torch or pandas.

A trace is a directory of Parquet files (`part-000000.parquet`, ...), one per
flushed row group, so that every flushed row survives a crash or a kill.
`pandas.read_parquet(path)` reads the directory as one table. Each part carries
the run metadata, as JSON, under the plain Parquet footer key `optrace`
(`pq.read_metadata(part).metadata`, where every Parquet reader looks), stored
once (tracer.store.writer `write_table`; v1 and v2 traces kept it inside the footer's
serialised Arrow schema instead: `footer_metadata` reads both); the part with the
highest number holds the newest copy, and its `complete` field is true only when
the tracer closed cleanly.
"""

import base64
import bisect
import enum
import re

import pyarrow as pa

SCHEMA_VERSION = 4
METADATA_KEY = b"optrace"
PART_GLOB = "part-*.parquet"
# The marker says "this directory is an optrace trace": a Parquet file of zero rows with the trace's
# columns, holding its facts ({"format": "optrace", "trace_id": ...}, closing facts) as JSON under
# MARKER_KEY in its footer. Every engine reads a trace directory holding it: pyarrow, pandas and
# Spark skip `_` names; DuckDB and polars read it as zero rows of the same schema. (polars refuses a
# directory holding a file of another extension: the JSON marker of earlier traces, still read.)
MARKER_NAME = "_optrace.parquet"
LEGACY_MARKER_NAME = "_optrace.json"  # the marker before: the same facts as a plain JSON file
MARKER_KEY = b"optrace.marker"
ARROW_SCHEMA_KEY = b"ARROW:schema"  # the Arrow schema in a Parquet footer (Arrow's own key)


def part_name(index: int) -> str:
    return f"part-{index:06d}.parquet"


# The tracer writes a trace's many small parts again as fewer (tracer.store.small_parts SmallParts: 64 neighbouring
# files at a time during the run, all of them at a clean close): `part-000000-000099.parquet` holds the rows
# of parts 0 to 99. It is renamed into place before the files it holds are removed, so a process killed in
# between leaves both; every optrace reader lists parts through `part_paths`, which leaves out the files a
# merged part holds.
_PART = re.compile(r"part-(\d{6,})\.parquet")
_MERGED = re.compile(r"part-(\d{6,})-(\d{6,})\.parquet")


def merged_name(first: int, last: int) -> str:
    """The name of the part holding the rows of parts `first` to `last` (merged)."""
    return f"part-{first:06d}-{last:06d}.parquet"


def is_merged_name(name: str) -> bool:
    return _MERGED.fullmatch(name) is not None


def is_part_name(name: str) -> bool:
    """Whether the tracer writes parts under `name` (a part's or a merged part's name; not a copy's)."""
    return _PART.fullmatch(name) is not None or _MERGED.fullmatch(name) is not None


def merged_span(name: str):
    """(first, last) part a merged part's name says it holds, or None for another name."""
    m = _MERGED.fullmatch(name)
    return (int(m[1]), int(m[2])) if m else None


def superseded(names, within=None):
    """The part names in `names` whose rows a merged part in `names` holds: a part, or a merged part of a
    narrower span (left by a merge cut short). `within` (first, last): only those inside that span."""
    spans = sorted({span for span in map(merged_span, names) if span}, key=lambda s: (s[0], -s[1]))
    if not spans:
        return set()
    wide = []  # the spans no other holds, in order: those are what the held names are checked against
    for low, high in spans:
        if not wide or high > wide[-1][1]:
            wide.append((low, high))
    starts = [low for low, _ in wide]
    gone = set()
    for name in names:
        if m := _PART.fullmatch(name):
            low = high = int(m[1])
        elif span := merged_span(name):
            low, high = span
        else:
            continue
        i = bisect.bisect_right(starts, low) - 1  # the widest span starting at or before `low`
        if (
            i >= 0
            and high <= wide[i][1]
            and wide[i] != (low, high)
            and (within is None or within[0] <= low and high <= within[1])
        ):
            gone.add(name)
    return gone


class Phase(enum.IntEnum):
    """The phase of an op; the value is its index in PHASES (the phase column's dictionary)."""

    FORWARD = 0
    BACKWARD = 1
    OPTIMIZER = 2
    OTHER = 3


PHASES = tuple(p.name.lower() for p in Phase)


class GradMode(enum.IntEnum):
    """Autograd's mode at an op (the grad_mode column); the value is its index in GRAD_MODES (the column's dictionary).

    Read from the thread's state when the op runs: torch.is_grad_enabled(), then torch.is_inference_mode_enabled()
    (inference mode turns grad mode off too). The backward pass runs in NO_GRAD unless create_graph=True, an
    optimizer's step in NO_GRAD (torch.optim's steps turn it off)."""

    GRAD = 0  # grad mode on: a forward op here is recorded for a backward
    NO_GRAD = 1  # off: torch.no_grad(), torch.set_grad_enabled(False)
    INFERENCE_MODE = 2  # torch.inference_mode()


GRAD_MODES = tuple(g.name.lower() for g in GradMode)


class FlopBasis(enum.IntEnum):
    """How the dispatch hook finds an op's FLOPs (tracer.recording.dispatch `_OpInfo.basis`)."""

    ZERO = 0  # the op does no arithmetic
    PER_OUTPUT_ELEMENT = 1  # one FLOP per output element: the writer counts them from the output shapes
    FORMULA = 2  # ask the op's FLOP formula
    DETAILED = 3  # ask the op's formula for a FlopCount: FLOPs, whether they are a bound, group sizes


# In a module name: the model's modules are its class name and dotted paths below it; a module
# outside the model run outside every module is an external root `<ClassName>#<k>` (tracer.recording.modules.
# ModuleNames), e.g. a frozen teacher `MLP#1` with `MLP#1.fc1` below it. Such a root is no child of
# the model. (One that a module calls is named below its caller: `layers.3.mixer.Func`.)
EXTERNAL_MARK = "#"

# Sentinels of the packed integer row (tracer.store.row_buffer ROW_FIELDS); each becomes null in Parquet.
CAUSAL_NONE = -1  # causal: not an attention kernel
NO_VALUE = -1  # busy_ns, comm_bytes, group_size: not measured / not a collective; groups: no group sizes
INT64_MAX = 2**63 - 1  # a row's flops above this are stored as INT64_MAX with flops_bound true
MIN_STEP_TIME_S = (
    1e-9  # a step shorter than a nanosecond is a unit mistake, not a measurement (set_step_time, --step-time)
)
MAX_TOKENS = 2**53  # tokens per step: exact in float64, where the figures made from them are computed

FLOP_KINDS = (
    "matmul",  # mm, bmm, addmm, baddbmm, mv, dot, _scaled_mm, _int_mm, ...
    "attention",  # fused scaled-dot-product attention kernels
    "conv",  # convolution and its backward
    "elementwise",  # one FLOP per output element
    "reduction",  # one FLOP per input element
    "norm",  # layer norm, RMS norm, batch norm, group norm
    "softmax",  # softmax, log_softmax and their backward
    "foreach",  # the optimizer's _foreach_* ops
    "collective",  # c10d / functional collectives: 0 FLOPs, comm_bytes says what moved
    "none",  # views, copies, fills, allocation, random numbers: no arithmetic
    "unknown",  # no formula registered: counted as 0
)

_shape_list = pa.list_(pa.list_(pa.int64()))
_str = pa.dictionary(pa.int32(), pa.string())

# (name, type, meaning): docs/schema.md's column table holds one row per entry (tests/tracer/store/test_schema.py checks it).
COLUMNS = (
    ("seq", pa.int64(), "op index in the trace, from 0"),
    ("step", pa.int64(), "training step: begins with the first forward work after an optimizer step or Tracer.step()"),
    ("op", _str, "aten overload, e.g. aten.mm.default"),
    ("phase", _str, "forward | backward | optimizer | other"),
    ("module", _str, "dotted path of the innermost module ('' outside any module)"),
    ("input_shapes", _shape_list, "shape of every tensor input, in argument order"),
    ("input_dtypes", pa.list_(_str), "dtype of every tensor input"),
    ("input_strides", _shape_list, "strides of every tensor input, in elements"),
    ("output_shapes", _shape_list, "shape of every tensor output"),
    ("output_dtypes", pa.list_(_str), "dtype of every tensor output"),
    ("output_strides", _shape_list, "strides of every tensor output, in elements"),
    ("device", _str, "device of the first tensor argument, e.g. cpu, cuda:0, meta"),
    ("input_storage_ids", pa.list_(pa.int64()), "storage id of every tensor input"),
    ("output_storage_ids", pa.list_(pa.int64()), "storage id of every tensor output"),
    (
        "freed_storage_ids",
        pa.list_(pa.int64()),
        "storages freed since the previous op (their last use came before this op)",
    ),
    ("is_view", pa.bool_(), "every output shares an input's storage and nothing is written: no new memory"),
    ("inplace", pa.bool_(), "the op writes into one of its inputs"),
    ("flops", pa.int64(), "analytic FLOPs, 2 per multiply-add"),
    ("flop_kind", _str, "which formula counted the FLOPs (see FLOP_KINDS)"),
    ("causal", pa.bool_(), "for attention kernels: was the mask causal (null for other ops)"),
    ("bytes_allocated", pa.int64(), "bytes of the storages this op created (0 for views)"),
    ("live_bytes", pa.int64(), "bytes of all live storages the tracer has seen, after the op"),
    ("bytes_read", pa.int64(), "bytes of the tensor inputs (numel x element size)"),
    ("bytes_written", pa.int64(), "bytes of the tensor outputs that are not views"),
    (
        "duration_ns",
        pa.int64(),
        "time of the op: CUDA-event time (timing='events') or synchronised wall time ('sync') on CUDA, perf_counter_ns on a CPU, 0 with timing='off'",
    ),
    # added in v2
    (
        "recompute",
        pa.bool_(),
        "the op re-runs forward work for activation checkpointing (MFU leaves it out, HFU counts it)",
    ),
    (
        "output_storage_bytes",
        pa.list_(pa.int64()),
        "byte size of the whole storage behind every tensor output, after the op",
    ),
    (
        "start_ns",
        pa.int64(),
        "op start on the wall clock, ns since the Unix epoch (time.time_ns at trace start + a monotonic offset)",
    ),
    (
        "busy_ns",
        pa.int64(),
        "device time of the op with the device's idle gap before it removed; equals duration_ns on CPU; null with timing='off'",
    ),
    (
        "layout",
        _str,
        "'' when every tensor argument is strided, else the first other layout (sparse_coo, sparse_csr, jagged, ...)",
    ),
    ("comm_bytes", pa.int64(), "collectives: message size as nccl-tests defines it (null for other ops)"),
    ("group_size", pa.int64(), "collectives: ranks in the process group (null for other ops)"),
    ("process_group", _str, "collectives: the process group's name ('' for other ops)"),
    # added in v3
    (
        "flops_bound",
        pa.bool_(),
        "flops is an upper bound, not a count: lengths or group sizes could not be read (meta, fake, symbolic) or the count passed INT64_MAX",
    ),
    (
        "group_sizes",
        pa.list_(pa.int64()),
        "grouped ops: rows per group (tokens per expert of _grouped_mm, sequence lengths of jagged attention); null for other ops",
    ),
    # added in v4
    (
        "grad_mode",
        _str,
        "autograd's mode at the op: grad | no_grad | inference_mode (GradMode); null in traces before v4 (unknown)",
    ),
)

# Columns a v1 trace lacks, and the value `reports.load` gives them when reading one.
V2_DEFAULTS = {
    "recompute": False,
    "output_storage_bytes": None,
    "start_ns": None,
    "busy_ns": None,  # load copies duration_ns
    "layout": "",
    "comm_bytes": None,
    "group_size": None,
    "process_group": "",
}

# Columns a v2 (or v1) trace lacks, and the value `reports.load` gives them when reading one.
V3_DEFAULTS = {
    "flops_bound": False,
    "group_sizes": None,
}


# Columns a v3 (or older) trace lacks, and the value `reports.load` gives them when reading one: null, unknown (a
# report then decides as it did before v4, from what the rows show).
V4_DEFAULTS = {
    "grad_mode": None,
}


def missing_columns(version: int) -> dict:
    """{column: default} of the columns a trace of schema `version` lacks."""
    return {
        **(V2_DEFAULTS if version < 2 else {}),
        **(V3_DEFAULTS if version < 3 else {}),
        **(V4_DEFAULTS if version < 4 else {}),
    }


COLUMN_NAMES = tuple(name for name, _, _ in COLUMNS)
ARROW_SCHEMA = pa.schema([pa.field(name, typ) for name, typ, _ in COLUMNS])

# Metadata fields (JSON under METADATA_KEY; docs/schema.md "Run metadata" says what each key means):
#   schema_version, complete, run_name, start_time, end_time, torch_version,
#   python_version, device {type, name, ...properties}, tokens, root_module,
#   params {total, trainable, embedding}, parameters {name: {storage_id,
#   numel, dtype, shape, trainable, embedding}}, storage_roles {gradient: [ids],
#   optimizer_state: [ids], external_parameter: [ids of the parameters of modules
#   outside model=, e.g. a frozen teacher], buffer: [ids of model='s buffers at entry]} (each part holds the roles learned
#   since the part before it; read_metadata merges them), rows, step_time (untraced step
#   timing, when measured), error (the exception that ended the traced block),
#   trace_id (the same in every part of one trace), parts (parts written,
#   this one included), lost_rows, record_errors, write_errors (the first
#   failed write: file and OS error), compiled_ran_eagerly (torch.compile ran eagerly), compiled_regions_eager
#   {calls, names: {module class or function name: calls}, other_calls} (tracer.recording.compiled EagerCompiled), compiled_codes_given_back
#   (codes Dynamo skipped under the mode, given back to it at exit: tracer.recording.compiled DynamoSkips),
#   timing {mode: events | sync | wall | off, unresolved_rows}, bandwidth (the
#   memory triad tracer.memory_bandwidth measured, when recorded).
#   meter: a metered run's per-step table (tracer.metering.meter Meter.table; docs/meter.md).

ROLE_KEYS = ("gradient", "optimizer_state", "external_parameter", "buffer")
# Size records kept in storage_roles beside the id lists (tracer.recording.metadata): key -> the fields of each record.
ROLE_RECORDS = {"at_entry": ("id", "bytes"), "resized": ("seq", "id", "bytes")}


def part_paths(path, names=None):
    """The part files of a trace directory, in write order: the names PART_GLOB matches, listed
    (never globbed: the path is taken literally, `[` and `*` included), less those a merged part
    holds (`superseded`). [] when `path` is no directory. `names`: the directory's listing, when the
    caller has one (what it checks is then what is read, though a live trace merges meanwhile)."""
    import fnmatch
    import os

    path = os.fspath(path)
    if names is None:
        try:
            names = os.listdir(path)
        except (FileNotFoundError, NotADirectoryError):
            return []
    names = fnmatch.filter(names, PART_GLOB)
    gone = superseded(names)
    return [os.path.join(path, name) for name in sorted(names, key=_write_order) if name not in gone]


_NUMBERED = re.compile(r"part-(\d+)(?:-(\d+))?")


def _write_order(name):
    """A part name's place in write order: by its part numbers, so part-1000000 follows part-999999; the
    tracer's own name before another with the same numbers (a copy: `part-000064 (1).parquet`)."""
    m = _NUMBERED.match(name)
    if m is None:
        return float("inf"), 0, 1, name
    return int(m[1]), int(m[2] or m[1]), not is_part_name(name), name


def merge_metadata(metas) -> dict:
    """One trace's metadata from its parts' metadata dicts, in write order: the newest
    part's copy, with the storage roles (each part records only its deltas) merged."""
    meta = {}
    roles = {key: [] for key in ROLE_KEYS}
    for meta in metas:
        for key, ids in meta.get("storage_roles", {}).items():
            roles.setdefault(key, []).extend(ids)
    if meta:
        meta = dict(meta, storage_roles=roles)
    return meta


def footer_metadata(file_metadata):
    """The raw optrace metadata (JSON bytes) of a part from its Parquet footer (`pq.read_metadata(part)`),
    or None: the plain footer key (v3 on), else inside the serialised Arrow schema (v1, v2)."""
    raw = (file_metadata.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raw = (file_metadata.schema.to_arrow_schema().metadata or {}).get(METADATA_KEY)
    return raw


def read_part(part):
    """One part as a pyarrow Table whose schema metadata holds the run metadata (`{METADATA_KEY: JSON}`), as
    pyarrow showed it before v3 (it leaves a plain footer key out of the schema when an Arrow schema is stored)."""
    import pyarrow.parquet as pq

    raw = footer_metadata(pq.read_metadata(part))
    table = pq.read_table(part)
    return table.replace_schema_metadata({METADATA_KEY: raw} if raw is not None else None)


def read_metadata(path) -> dict:
    """The run metadata of a trace, as the report reads it: merge_metadata over its parts,
    with the closing facts of its marker where they say more (after a full disk the last
    parts and their metadata are missing, but the marker, rewritten in place at close,
    still counts `lost_rows`, `record_errors` and the rows written; `complete` is false when
    either says so).

    A trace with a marker and no part (killed before its first part, or every write failed):
    the marker's facts, with `parts` and `rows` (written) 0 and `complete` false. A distributed trace (a directory of `rank=R` traces
    and no part of its own): {"world_size": ranks found, "complete": every rank complete,
    "ranks": {R: read_metadata of rank R}}. {} when `path` holds no optrace trace."""
    import json
    import os
    import re

    import pyarrow.parquet as pq

    path = os.fspath(path)
    parts = part_paths(path)
    if not parts and os.path.isdir(path):
        ranks = {}
        for name in os.listdir(path):
            match = re.fullmatch(r"rank=(\d+)", name)
            if match and os.path.isdir(os.path.join(path, name)):
                ranks[int(match[1])] = read_metadata(os.path.join(path, name))
        if ranks:
            ranks = dict(sorted(ranks.items()))
            return {
                "world_size": len(ranks),
                "complete": all(m.get("complete") is True for m in ranks.values()),
                "ranks": ranks,
            }
    for part in parts:  # a FIFO named like a part: never opened (pyarrow would wait on it for ever)
        if not _is_regular(part):
            raise NotRegular(f"{part} is not a regular file, not an optrace part; move it out of the trace")
    raws = (footer_metadata(pq.read_metadata(part)) for part in parts)
    meta = merge_metadata(json.loads(raw) for raw in raws if raw is not None)
    marker = marker_facts(path)
    if marker is None or marker.get("format") != "optrace":
        return meta
    if not meta:  # no part written: what the marker knows
        return dict(marker, parts=0, rows=0, complete=False)  # rows written, as in a part
    if marker.get("trace_id") == meta.get("trace_id"):
        facts = {key: marker.get(key) for key in ("rows", "lost_rows", "record_errors")}
        if isinstance(facts["rows"], int) and isinstance(facts["lost_rows"], int):
            facts["rows"] -= facts["lost_rows"]  # the marker counts rows recorded; the parts, rows written
        for key, value in facts.items():
            current = meta.get(key)
            if isinstance(value, int) and (not isinstance(current, int) or value > current):
                meta[key] = value
        meta["write_error"] = meta.get("write_error") or marker.get("write_error")
        meta["complete"] = bool(meta.get("complete")) and marker.get("complete", True) is not False
    return meta


def arrow_footer(schema):
    """The footer entry that carries `schema` (without its metadata) for Arrow readers: with it they
    get the dictionary columns back as dictionaries (polars as Categorical)."""
    return {ARROW_SCHEMA_KEY: base64.b64encode(schema.remove_metadata().serialize().to_pybytes())}


def marker_file(text):
    """The bytes of a marker holding `text` (JSON): a Parquet file of zero rows with the trace's columns.
    Its length depends only on len(text), so a marker can be rewritten in place with new facts.

    The text is stored verbatim in the footer, and nothing else in the file depends on it but its length:
    the bytes are those of a marker built once per length, with `text` in place of its filler (the same
    bytes pyarrow writes, without its two Parquet writes per trace)."""
    data = text.encode()
    prefix, suffix = _marker_template(len(data))
    if prefix is None:
        return _marker_file(data)
    return prefix + data + suffix


_templates = {}  # text length -> (bytes before the text, bytes after it), or (None, None)


def _marker_template(length):
    found = _templates.get(length)
    if found is None:
        filler = (b"optrace-marker-filler:" * (length // 22 + 1))[:length]
        data = _marker_file(filler)
        at = data.find(filler)
        unique = length >= 16 and at >= 0 and data.find(filler, at + 1) < 0
        found = _templates[length] = (data[:at], data[at + length :]) if unique else (None, None)
    return found


def _marker_file(data):
    """A marker holding the bytes `data`, written by pyarrow."""
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, ARROW_SCHEMA, store_schema=False) as out:
        out.add_key_value_metadata({**arrow_footer(ARROW_SCHEMA), MARKER_KEY: data})
        out.write_table(pa.Table.from_batches([], schema=ARROW_SCHEMA))  # Schema.empty_table imports pandas
    return sink.getvalue().to_pybytes()


def read_marker_file(path, limit):
    """(name, at most limit + 1 bytes) of the marker of trace directory `path`: MARKER_NAME, else
    LEGACY_MARKER_NAME; (None, None) when it has neither or it cannot be read."""
    import os

    for name in (MARKER_NAME, LEGACY_MARKER_NAME):
        try:
            return name, read_regular(os.path.join(os.fspath(path), name), limit)
        except FileNotFoundError:
            continue
        except OSError:  # unreadable, or no regular file (a FIFO named like the marker: never read, never waited on)
            return name, None
    return None, None


def is_unicode(text):
    """Whether the str `text` encodes as UTF-8: a lone surrogate (os.fsdecode of a name that is not UTF-8, a
    Latin-1 one) does not, and every Parquet reader and every output would fail on it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_regular(file):
    import os
    import stat

    try:
        return stat.S_ISREG(os.stat(file).st_mode)
    except FileNotFoundError:
        return True  # merged away since the listing: its read says so
    except OSError:
        return False


class NotRegular(OSError):
    """A FIFO, a device, a socket or a directory where optrace reads or writes a file: never read, never waited on."""


def read_regular(file, limit, dir_fd=None):
    """At most limit + 1 bytes of the regular file `file` (relative to the directory descriptor `dir_fd` when given).
    OSError when it cannot be read; NotRegular for any other kind of file: opened without blocking (a FIFO with no
    writer would block an ordinary open for ever) and refused before a byte is read."""
    import os
    import stat

    fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(f"{os.fspath(file)} is not a regular file")
        return f.read(limit + 1)


def marker_json(raw):
    """The JSON bytes a marker's bytes hold: under MARKER_KEY in the footer of a Parquet marker, the
    whole of a JSON one (a legacy marker); None when there are none (no marker, a damaged Parquet one)."""
    if raw is None or raw[:4] != b"PAR1" or raw[-4:] != b"PAR1":
        return raw
    for length, (prefix, suffix) in list(_templates.items()):  # the bytes of a marker `marker_file` built: its text
        if (
            prefix is not None
            and len(raw) == len(prefix) + length + len(suffix)
            and raw.startswith(prefix)
            and raw.endswith(suffix)
        ):
            return raw[len(prefix) : len(prefix) + length]  # what the footer holds, read without parsing it again
    import pyarrow.parquet as pq

    try:
        return (pq.read_metadata(pa.BufferReader(raw)).metadata or {}).get(MARKER_KEY)
    except Exception:  # cut mid-rewrite, or not ours
        return None


def marker_facts(path):
    """The facts (a dict) in the marker of trace directory `path`, or None."""
    import json

    try:
        facts = json.loads(marker_json(read_marker_file(path, 1 << 16)[1]) or b"null")
    except (ValueError, RecursionError):
        return None
    return facts if isinstance(facts, dict) else None
