"""The GPU check: every CUDA path of optrace against torch.cuda's own figures, in one table.

    make gpu-check        # or: .venv/bin/python benchmarks/gpu_check.py  (a CUDA build of torch)

Sizes are set for an H100/H200 (under 4 minutes in all, most of it torch.compile compiling). One row a check:

  timing="events"   median duration_ns of 10 traced bf16 [8192, 8192] @ [8192, 8192] against torch.cuda.Event
                    pairs around the same matmuls untraced; busy_ns / duration_ns (the GPU is behind the CPU: ~1)
  timing="sync"     the same matmuls, a synchronised wall clock (synchronise and clock reads on top: +0.1 ms)
  cuda_memory       the metadata's start and end figures against torch.cuda.memory_allocated and
                    max_memory_allocated read around the block; the trace's peak live_bytes against torch's peak
  Meter             untraced step time against the same steps timed by hand with torch.cuda.synchronize; the
                    step's FLOPs against their arithmetic; tracer.peaks finds the device's bf16 peak; MFU in (0, 1]
  torch.compile     a compiled model traced (the eager trace's FLOPs, `compiled_ran_eagerly`, no recompilation
                    after the block) and metered (step time as timed by hand)
  NCCL              2 ranks (torch.multiprocessing), all_reduce and all_gather_into_tensor traced: comm_bytes as
                    nccl-tests define it; with fewer than 2 GPUs a row says why it was skipped

Each check is guarded: an exception fails its row and the table goes on. Exit status 1 when a row failed, else 0.
Without a CUDA device it prints one line and exits 0.
"""

import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import reports  # noqa: E402
from tracer import Meter, Tracer, read_metadata  # noqa: E402
from tracer.device import device_info  # noqa: E402
from tracer.peaks import lookup, match_device  # noqa: E402

BUDGET_S = 200  # a check not started by then is a failed row: the whole run is meant to take under 4 minutes
N, REPEATS = 8192, 10  # the timed matmul: 2 * 8192**3 = 1.1 TFLOP, about 1.5 ms on an H100 in bf16
BATCH, WIDTH, LAYERS, STEPS = 8192, 4096, 4, 12  # the metered model: 3 TFLOP, about 4 ms a step on an H100
MEMORY_N = 4096  # the memory check's fp32 [4096, 4096] tensors: 64 MiB each
NCCL_NUMEL, NCCL_TIMEOUT_S = 1 << 20, 120


def within(measured, expected, rel, floor=0.0):
    """Whether `measured` is `expected` to within rel * |expected| or floor, whichever is larger."""
    return abs(measured - expected) <= max(rel * abs(expected), floor)


class Table:
    """Rows of (check, expected, measured, ok): ok True, False, or None for a check skipped."""

    def __init__(self):
        self.rows = []

    def add(self, check, expected, measured, ok):
        self.rows.append((check, str(expected), str(measured), ok))

    def guarded(self, name, check, *args, deadline=None):
        """Run check(self, *args); an exception (or a deadline passed) becomes a failed row named `name`."""
        if deadline is not None and time.monotonic() > deadline:
            self.add(name, "runs", f"not run: the {BUDGET_S} s budget was spent", False)
            return
        try:
            check(self, *args)
        except Exception as exc:
            self.add(name, "runs", f"{type(exc).__name__}: {exc}".replace("\n", " ")[:160], False)

    def failed(self):
        return any(ok is False for *_, ok in self.rows)

    def render(self):
        cells = [("check", "expected", "measured", "ok")]
        cells += [(c, e, m, {True: "ok", False: "FAIL", None: "skip"}[ok]) for c, e, m, ok in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(4)]
        lines = [" | ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
        lines.insert(1, "-+-".join("-" * w for w in widths))
        return "\n".join(lines)


# workloads ---------------------------------------------------------------------------------------------------
class Holder(torch.nn.Module):
    """Holds a check's tensor as a frozen parameter: model=Holder(a) gives the Tracer its device at entry (its
    first parameter's), so the first op is timed by events and cuda_memory's start is read at entry."""

    def __init__(self, a):
        super().__init__()
        self.a = torch.nn.Parameter(a, requires_grad=False)


def mlp(device):
    """LAYERS bias-free bf16 linears of WIDTH, and a [BATCH, WIDTH] input."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)]
    return torch.nn.Sequential(*layers).to(device, torch.bfloat16), torch.randn(BATCH, WIDTH).to(device, torch.bfloat16)


def train_step(model, x):
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()


def mlp_flops():
    """Forward + backward FLOPs of train_step on mlp: the input needs no gradient."""
    # forward: LAYERS matmuls [b, w] @ [w, w], 2 * b * w * w each; backward: dL/dW of every layer and dL/dx of
    # all but the first, 2 * LAYERS - 1 more of the same size; the sum: b * w adds
    return (3 * LAYERS - 1) * 2 * BATCH * WIDTH * WIDTH + BATCH * WIDTH


def hand_event_ms(fn):
    """Median ms of fn() between torch.cuda.Event pairs, recorded back to back as the tracer records them."""
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPEATS)]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in pairs)


def hand_step_s(fn):
    """Median seconds of fn() with torch.cuda.synchronize before and after each call."""
    times = []
    for _ in range(STEPS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def training_flops(path):
    df = reports.load(path)
    return int(df.loc[df["phase"].isin(["forward", "backward"]), "flops"].sum())


# checks ------------------------------------------------------------------------------------------------------
def check_timing(table, tmp, device):
    a = torch.randn(N, N, device=device, dtype=torch.bfloat16)
    for _ in range(2 * REPEATS):  # untraced: cuBLAS's handle and workspace made, the clocks up
        a @ a
    torch.cuda.synchronize()
    hand = hand_event_ms(lambda: a @ a)
    for mode, floor in (("events", 0.05), ("sync", 0.1)):
        with Tracer(tmp / mode, model=Holder(a), timing=mode):
            for _ in range(REPEATS):
                a @ a
        rows, meta = reports.load(tmp / mode), read_metadata(tmp / mode)
        rows = rows[rows["op"] == "aten.mm.default"]
        facts = f"{meta['timing']['mode']}, {meta['timing']['unresolved_rows']}, {meta['collector']['path']}"
        table.add(
            f'Tracer(timing="{mode}"): timer, unresolved rows, collector',
            f"{mode}, 0, compiled",
            facts,
            facts == f"{mode}, 0, compiled",
        )
        traced = rows["duration_ns"].median() / 1e6
        table.add(
            f'Tracer(timing="{mode}") mm ms, median of {len(rows)}',
            f"{hand:.3f} (cuda.Event by hand, 10%)",
            f"{traced:.3f}",
            len(rows) == REPEATS and within(traced, hand, 0.10, floor),
        )
        if mode == "events":
            busy = float((rows["busy_ns"] / rows["duration_ns"]).median())
            table.add(
                "events busy_ns / duration_ns, median",
                "0.9 to 1 (GPU behind the CPU)",
                f"{busy:.3f}",
                0.9 <= busy <= 1.0,
            )
            table.add("mm FLOPs (each row)", 2 * N**3, sorted(set(rows["flops"])), set(rows["flops"]) == {2 * N**3})


def check_memory(table, tmp, device):
    a = torch.randn(MEMORY_N, MEMORY_N, device=device)
    a @ a
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with Tracer(tmp / "memory", model=Holder(a)):
        b = a @ a
        c = b @ b
        del b
        d = c @ c
        del c, d
    peak, after = torch.cuda.max_memory_allocated(device), torch.cuda.memory_allocated(device)
    memory = read_metadata(tmp / "memory")["cuda_memory"]
    for when, key, expected in (
        ("start", "allocated_bytes", before),
        ("end", "allocated_bytes", after),
        ("end", "max_allocated_bytes", peak),
    ):
        got = memory[when][key]
        table.add(f"cuda_memory {when} {key}", f"{expected} (torch.cuda)", got, got == expected)
    live = int(reports.load(tmp / "memory")["live_bytes"].max())
    expected = peak - before + a.nbytes  # the trace counts a (at entry) and what the block made (b and c)
    table.add(
        "trace peak live_bytes", f"{expected} (torch's peak - before + a, 1%)", live, within(live, expected, 0.01)
    )


def _meter_steps(tmp, name, model, x, warmup=0):
    """Step figures of a Meter over STEPS steps, the untraced ones only."""
    with Meter(tmp / name, model=model, warmup=warmup) as meter:
        figures = []
        for _ in range(STEPS):
            train_step(model, x)
            figures.append(meter.step())
    return [f for f in figures if not f["traced"] and f["model_flops"] is not None]


def check_meter(table, tmp, device):
    model, x = mlp(device)
    train_step(model, x)
    hand = hand_step_s(lambda: train_step(model, x))
    steps = _meter_steps(tmp, "meter", model, x)
    metered = statistics.median(f["step_time_s"] for f in steps)
    table.add(
        f"Meter step ms, median of {len(steps)} untraced",
        f"{hand * 1e3:.3f} (synchronised by hand, 10%)",
        f"{metered * 1e3:.3f}",
        len(steps) >= STEPS - 3 and within(metered, hand, 0.10, 0.5e-3),
    )
    flops = {f["model_flops"] for f in steps}
    table.add("Meter model_flops per step", mlp_flops(), sorted(flops), flops == {mlp_flops()})
    name = torch.cuda.get_device_name(device)
    peak, source = lookup(device_info(device), "bfloat16")
    table.add(
        "tracer.peaks: device and bf16 peak",
        f"a datasheet entry for {name!r}",
        f"{match_device(name)}: {peak / 1e12:.1f} TFLOP/s" if peak else source,
        peak is not None,
    )
    if peak is None:
        table.add("Meter MFU", "(0, 1]", "no peak for the device: no MFU", False)
        return
    mfus = [f["mfu"] for f in steps if f["mfu"] is not None]
    mfu = statistics.median(mfus) if mfus else None
    arithmetic = mlp_flops() / metered / peak
    table.add(
        "Meter MFU, median",
        f"(0, 1]; FLOPs / step time / peak = {arithmetic:.3f}",
        "None" if mfu is None else f"{mfu:.3f}",
        mfu is not None and 0 < mfu <= 1 and within(mfu, arithmetic, 0.05),
    )


def check_compiled(table, tmp, device):
    from torch._dynamo.utils import counters

    model, x = mlp(device)
    with Tracer(tmp / "eager", model=model):
        train_step(model, x)
    eager = training_flops(tmp / "eager")
    compiled = torch.compile(model)
    for _ in range(2):  # compiles the forward and the backward
        train_step(compiled, x)
    graphs = counters["stats"]["unique_graphs"]
    with Tracer(tmp / "compiled", model=compiled):
        train_step(compiled, x)
    traced = training_flops(tmp / "compiled")
    ran_eagerly = read_metadata(tmp / "compiled").get("compiled_ran_eagerly")
    table.add("torch.compile traced: FLOPs", f"{eager} (the eager trace's)", traced, traced == eager)
    table.add("torch.compile traced: compiled_ran_eagerly", True, ran_eagerly, ran_eagerly is True)
    train_step(compiled, x)
    again = counters["stats"]["unique_graphs"] - graphs
    table.add("torch.compile after the trace: new graphs", 0, again, again == 0)
    hand = hand_step_s(lambda: train_step(compiled, x))
    steps = _meter_steps(tmp, "compiled_meter", compiled, x, warmup=2)
    metered = statistics.median(f["step_time_s"] for f in steps)
    table.add(
        f"torch.compile Meter step ms, median of {len(steps)}",
        f"{hand * 1e3:.3f} (synchronised by hand, 10%)",
        f"{metered * 1e3:.3f}",
        len(steps) >= STEPS - 4 and within(metered, hand, 0.10, 0.5e-3),
    )
    flops = {f["model_flops"] for f in steps}
    table.add("torch.compile Meter model_flops", eager, sorted(flops), flops == {eager})


def _nccl_rank(rank, root, port):
    """One rank of the NCCL check: an all_reduce and an all_gather_into_tensor traced."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    try:
        t = torch.ones(NCCL_NUMEL, device="cuda")
        dist.all_reduce(t)  # NCCL's communicator, made untraced
        gathered = torch.empty(2 * NCCL_NUMEL, device="cuda")
        with Tracer(os.path.join(root, "nccl")):
            dist.all_reduce(t)
            dist.all_gather_into_tensor(gathered, t)
        torch.cuda.synchronize()
        if t[0].item() != 4.0 or gathered.sum().item() != 8.0 * NCCL_NUMEL:  # 1 summed twice over 2 ranks
            raise RuntimeError(f"rank {rank}: all_reduce gave {t[0].item()}, expected 4.0")
    finally:
        dist.destroy_process_group()


def check_nccl(table, tmp, device):
    import torch.multiprocessing as mp

    count = torch.cuda.device_count()
    if count < 2:
        table.add(
            "NCCL all_reduce, all_gather (2 ranks)", "2 GPUs", f"skipped: torch.cuda.device_count() = {count}", None
        )
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.start_processes(_nccl_rank, args=(str(tmp), port), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + NCCL_TIMEOUT_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.terminate()
            raise TimeoutError(f"the 2 NCCL ranks did not finish in {NCCL_TIMEOUT_S} s")
    df = reports.load(tmp / "nccl")
    bytes_ = 4 * NCCL_NUMEL  # fp32
    for op, expected in (("allreduce_", bytes_), ("_allgather_base_", 2 * bytes_)):  # all-gather: S is the output
        rows = df[df["op"] == f"c10d.{op}.default"]
        got = sorted(set(rows["comm_bytes"].tolist()))
        timed = bool((rows["duration_ns"] > 0).all())
        table.add(
            f"NCCL {op} comm_bytes, {len(rows)} rows (2 ranks)",
            expected,
            f"{got}, timed: {timed}",
            len(rows) == 2 and got == [expected] and timed,
        )


CHECKS = (
    ("timing", check_timing),
    ("cuda_memory", check_memory),
    ("Meter", check_meter),
    ("torch.compile", check_compiled),
    ("NCCL", check_nccl),
)


def main():
    if not torch.cuda.is_available():
        build = "" if torch.version.cuda else f"; torch {torch.__version__} is a CPU build"
        print(f"gpu-check: no CUDA device (torch.cuda.is_available() is False{build}); nothing to check")
        return 0
    began = time.monotonic()
    device = torch.device("cuda", torch.cuda.current_device())
    table = Table()
    with tempfile.TemporaryDirectory(prefix="optrace-gpu-check-") as tmp:
        for name, check in CHECKS:
            table.guarded(name, check, Path(tmp), device, deadline=began + BUDGET_S)
    print(
        f"gpu-check: {torch.cuda.get_device_name(device)} (GPUs: {torch.cuda.device_count()}), torch "
        f"{torch.__version__}, CUDA {torch.version.cuda}, {time.monotonic() - began:.0f} s"
    )
    print(table.render())
    return 1 if table.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
