"""Check that a change to the tracer leaves every recorded column as it was.

    # with the old code on PYTHONPATH, then with the new:
    PYTHONPATH=OLD .venv/bin/python benchmarks/same_trace.py write /tmp/before
    PYTHONPATH=NEW .venv/bin/python benchmarks/same_trace.py write /tmp/after
    .venv/bin/python benchmarks/same_trace.py compare /tmp/before /tmp/after

`write` traces a fixed set of workloads (the example GPT, a Hugging Face GPT-2 when
`transformers` is installed, activation checkpointing of both kinds, retain_graph,
gradient accumulation, a LLaMA-shaped model on the meta device); `compare` reads
each pair of traces and compares them column by column, every column but the
timing ones (TIMING_COLUMNS), and the run metadata but its times and ids.
Exit status 1 when anything differs.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))

TIMING_COLUMNS = ("duration_ns", "busy_ns", "start_ns")
VOLATILE_METADATA = ("start_time", "end_time", "trace_id", "run_name", "collector")


def _mlp(torch, n=3):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()) for _ in range(n)])


def workloads():
    import torch
    from torch.utils.checkpoint import checkpoint

    def example_gpt():
        from gpt import GPT, GPTConfig, make_batch, make_optimizer, train_step

        torch.manual_seed(0)
        cfg = GPTConfig()
        model = GPT(cfg)
        opt = make_optimizer(model)
        idx, targets = make_batch(cfg, 4)
        return model, lambda: [train_step(model, opt, idx, targets) for _ in range(2)]

    def hf_gpt2():
        from overhead import hf_gpt2 as make

        step = make()
        return (None, lambda: [step() for _ in range(2)]) if step is not None else None

    def checkpointed(reentrant):
        def make():
            model = _mlp(torch)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x = torch.randn(4, 16, requires_grad=True)

            def step():
                h = x
                for layer in model:
                    h = checkpoint(layer, h, use_reentrant=reentrant)
                h.sum().backward()
                opt.step()
                opt.zero_grad()

            return model, lambda: [step() for _ in range(2)]

        return make

    def retain_graph():
        model = _mlp(torch)
        x = torch.randn(4, 16)

        def run():
            loss = model(x).sum()
            loss.backward(retain_graph=True)
            loss.backward()

        return model, run

    def accumulation():
        model = _mlp(torch)
        opt = torch.optim.AdamW(model.parameters())

        def run():
            for _ in range(2):
                for k in range(3):
                    model(torch.full((4, 16), float(k))).sum().backward()
                opt.step()
                opt.zero_grad()

        return model, run

    def llama_meta():
        from disk_bytes import Llama

        with torch.device("meta"):
            model = Llama(2)
        opt = torch.optim.AdamW(model.parameters())
        idx = torch.zeros(1, 128, dtype=torch.long, device="meta")

        def run():
            model(idx, idx).backward()
            opt.step()

        return model, run

    def gradient_penalty():  # WGAN-GP: a second backward through a graph made in the first (create_graph)
        critic = _mlp(torch, 2)
        opt = torch.optim.SGD(critic.parameters(), lr=0.1)
        real = torch.randn(4, 16)

        def step():
            x = real.clone().requires_grad_(True)
            out = critic(x).sum()
            (grad,) = torch.autograd.grad(out, x, create_graph=True)
            (out + ((grad.norm(dim=1) - 1) ** 2).mean()).backward()
            opt.step()
            opt.zero_grad()

        return critic, lambda: [step() for _ in range(2)]

    return {
        "example_gpt": example_gpt,
        "hf_gpt2": hf_gpt2,
        "checkpoint_reentrant": checkpointed(True),
        "checkpoint_nonreentrant": checkpointed(False),
        "retain_graph": retain_graph,
        "accumulation": accumulation,
        "llama_meta": llama_meta,
        "gradient_penalty": gradient_penalty,
    }


def write(directory):
    from tracer import Tracer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, make in workloads().items():
        made = make()
        if made is None:
            print(f"{name}: skipped")
            continue
        model, run = made
        with Tracer(directory / name, model=model):
            run()
        print(f"{name}: written")


def compare(before, after):
    import reports
    from tracer import read_metadata

    failures = 0
    for trace in sorted(p.name for p in Path(before).iterdir()):
        a, b = reports.load(Path(before) / trace), reports.load(Path(after) / trace)
        different = [c for c in a.columns if c not in TIMING_COLUMNS and not _same(a[c], b[c] if c in b else None)]
        if len(a) != len(b) or list(a.columns) != list(b.columns):
            different.insert(0, f"shape {a.shape} vs {b.shape}")
        ma, mb = read_metadata(Path(before) / trace), read_metadata(Path(after) / trace)
        for key in VOLATILE_METADATA:
            ma.pop(key, None), mb.pop(key, None)
        if ma != mb:
            different.append("metadata: " + ", ".join(k for k in set(ma) | set(mb) if ma.get(k) != mb.get(k)))
        print(f"{trace}: {len(a)} rows, {'identical' if not different else 'DIFFERENT: ' + '; '.join(different)}")
        failures += bool(different)
    return failures


def _same(x, y):
    if y is None or len(x) != len(y):
        return False
    return [_plain(v) for v in x] == [_plain(v) for v in y]


def _plain(value):
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value != value:  # NaN / NA
        return None
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("write").add_argument("directory")
    cmp = sub.add_parser("compare")
    cmp.add_argument("before")
    cmp.add_argument("after")
    args = parser.parse_args(argv)
    if args.command == "write":
        write(args.directory)
        return 0
    return 1 if compare(args.before, args.after) else 0


if __name__ == "__main__":
    sys.exit(main())
