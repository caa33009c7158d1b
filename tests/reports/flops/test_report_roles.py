"""Row roles in the FLOP reports: weight-gradient matmuls, weights outside model=, checkpoint recomputation.

The traces are real; where the tracer does not record a fact yet (the `recompute`
flag, the `external_parameter` storage role), the test writes it into the trace's
Parquet part, as a tracer that records it would, and reads the trace back.
"""

import glob
import json
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import reports
from reports._util import ONE_TO_ONE_COPIES
from reports.flops import walks
from reports.flops.rows import as_rows
from reports.flops.walks import gradient_sources
from tests.helpers import unwrapped
from tracer import Tracer
from tracer.schema import METADATA_KEY, read_part

TOKENS = 32


def _rewrite(path, recompute=None, roles=None):
    """Rewrite the trace's parts: recompute=True on rows where recompute(frame) is True; add storage roles."""
    for part in sorted(glob.glob(os.path.join(path, "part-*.parquet"))):
        table = read_part(part)
        meta = json.loads(table.schema.metadata[METADATA_KEY])
        if recompute is not None:
            flags = recompute(table.to_pandas())
            i = table.schema.get_field_index("recompute")
            table = table.set_column(i, "recompute", pa.array(flags.to_numpy(dtype=bool)))
        if roles:
            meta.setdefault("storage_roles", {}).update(roles)
        table = table.replace_schema_metadata({**table.schema.metadata, METADATA_KEY: json.dumps(meta).encode()})
        pq.write_table(table, part)
    return reports.load(path)


# 9. the weight-gradient walk is not transitive -------------------------------------------------
class EmbedGram(nn.Module):
    """embedding -> x @ xᵀ: every matmul multiplies two activations."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)

    def forward(self, idx):
        x = self.emb(idx)
        return (x @ x.T).sum()


def test_activation_matmuls_feeding_an_embedding_gradient_are_attention(tmp_path):
    torch.manual_seed(0)
    model = EmbedGram()
    with Tracer(tmp_path / "gram", model=model, tokens=TOKENS):
        model(torch.randint(0, 16, (TOKENS,))).backward()
    t = reports.breakdown(reports.load(tmp_path / "gram")).set_index("phase")
    # forward x @ xᵀ: [32, 8] @ [8, 32]: 2·32·8·32 = 16,384 FLOPs of attention; no weight enters a matmul
    assert t.loc["forward", "attention_flops"] == 16384 and t.loc["forward", "weight_matmul_flops"] == 0
    # backward: dL/dx twice (once per operand), 2 x 16,384 = 32,768, summed (add) and then turned into the
    # embedding's gradient by embedding_dense_backward: not one cast/add away from the gradient, so attention
    assert t.loc["backward", "attention_flops"] == 32768
    assert t.loc["backward", "weight_matmul_flops"] == 0


def test_a_weight_used_three_times_has_all_its_gradient_matmuls(tmp_path):
    """An unrolled RNN / a layer called three times: its three dW are summed by two adds."""
    torch.manual_seed(0)
    layer = nn.Linear(8, 8, bias=False)
    model = nn.Sequential(layer)
    x = torch.randn(TOKENS, 8)
    with Tracer(tmp_path / "thrice", model=model, tokens=TOKENS):
        layer(layer(layer(x))).sum().backward()
    t = reports.breakdown(reports.load(tmp_path / "thrice")).set_index("phase")
    # each use: [32, 8] @ [8, 8]: 2·32·8·8 = 4,096 = 2·N·T with N = 64, T = 32
    assert t.loc["forward", "weight_matmul_flops"] == 3 * 4096
    # backward: three dW (3 x 4,096) + dL/dx of the 2nd and 3rd uses (2 x 4,096; x needs no gradient)
    assert t.loc["backward", "weight_matmul_flops"] == 5 * 4096
    assert t.loc["backward", "attention_flops"] == 0


def _hops(ops):
    """Backward rows: row i reads storage i and writes storage i + 1; storage 0 is the matmul's output."""
    return pd.DataFrame(
        {
            "op": ops,
            "phase": "backward",
            "input_storage_ids": [[i] for i in range(len(ops))],
            "output_storage_ids": [[i + 1] for i in range(len(ops))],
        }
    )


@pytest.mark.parametrize(
    "ops, weight_gradient",
    [
        ([], True),  # the matmul writes the gradient itself
        (["aten._to_copy.default"], True),  # a bf16 dW cast to fp32
        (["aten.add.Tensor"], True),  # tied weights: two gradients summed
        (["aten._to_copy.default", "aten.add_.Tensor"], True),  # cast, then accumulated into .grad
        (["aten.mul.Tensor"], False),  # any other op breaks the chain
        (["aten.add.Tensor", "aten.embedding_dense_backward.default"], False),
        (["aten._to_copy.default", "aten.clone.default"], False),  # two casts
        (["aten.add.Tensor", "aten.add.Tensor"], True),  # three uses of one weight: three dW summed by two adds
        (["aten._to_copy.default", "aten.add.Tensor", "aten.add.Tensor", "aten.add_.Tensor"], True),
        (["aten.add.Tensor", "aten.mul.Tensor", "aten.add.Tensor"], False),
    ],
)
def test_gradient_sources_follow_adds_and_one_cast_at_most(ops, weight_gradient):
    rows = _hops(ops)
    packets = rows["op"].map(lambda op: ".".join(op.split(".")[:2]))
    assert (0 in gradient_sources(rows, packets, {len(ops)})) is weight_gradient


def test_gradient_sources_follow_a_chain_longer_than_the_pruning_rounds():
    # 3 * walks._ROUNDS adds (an unrolled RNN's dW summed step by step): the rounds that leave rows out stop before
    # the chain's start, and the walk still reaches storage 0
    ops = ["aten.add.Tensor"] * (3 * walks._ROUNDS)
    rows = _hops(ops)
    packets = rows["op"].map(lambda op: ".".join(op.split(".")[:2]))
    assert gradient_sources(rows, packets, {len(ops)}) == set(range(len(ops) + 1))  # 0 .. 24: every storage


def _reference_walk(ops, phases, ins, outs, gradients):
    """gradient_sources as a walk of every row, the last first (what reports.flops.walks.gradient_ids returns)."""
    moves = walks._GRADIENT_MOVES | walks.GRADIENT_PLACES
    reach = dict.fromkeys(gradients, frozenset({0}))
    for op, phase, i, o in reversed(list(zip(ops, phases, ins, outs))):
        name = ".".join(op.split(".")[:2])
        copy = name in ONE_TO_ONE_COPIES
        if phase not in ("backward", "other") or not (copy or name in walks._ADDS or name in moves):
            continue
        hits = [reach[s] for s in o if s in reach]
        if not hits:
            continue
        states = frozenset().union(*hits)
        after = frozenset(c + 1 for c in states if c == 0) if copy and name not in moves else states
        for sid in i if after else ():
            reach[sid] = reach.get(sid, frozenset()) | after
    return set(reach)


@pytest.mark.parametrize("seed", range(12))
def test_gradient_sources_equal_a_walk_of_every_row(seed):
    rng = np.random.default_rng(seed)
    names = ["aten.add.Tensor", "aten.add_.Tensor", "aten._to_copy.default", "aten.clone.default", "aten.mul.Tensor",
             "aten.slice_backward.default", "aten.cat.default", "aten.mm.default"]  # fmt: skip
    n = 300
    ops = rng.choice(names, n).tolist()
    phases = rng.choice(["forward", "backward", "other"], n, p=[0.2, 0.6, 0.2]).tolist()
    ins = [rng.integers(0, 80, rng.integers(1, 4)).tolist() for _ in range(n)]
    outs = [rng.integers(0, 80, rng.integers(1, 3)).tolist() for _ in range(n)]
    gradients = set(rng.integers(0, 80, 6).tolist())
    rows = pd.DataFrame({"op": ops, "phase": phases, "input_storage_ids": ins, "output_storage_ids": outs})
    packets = rows["op"].map(lambda op: ".".join(op.split(".")[:2]))
    found = gradient_sources(rows, packets, gradients)
    assert found == _reference_walk(ops, phases, ins, outs, gradients)
    assert found > gradients  # the walk reached storages beyond the gradients themselves


def _reference_copies(ops, ins, outs, sources):
    """copies_of (without gathers or scaled weights) as a walk of every row in order."""
    alias = {s: s for s in sources}
    for op, i, o in zip(ops, ins, outs):
        name = ".".join(op.split(".")[:2])
        if name not in ONE_TO_ONE_COPIES and name not in walks.DERIVED or not i:
            continue
        src = i[1] if name == "aten.copy_" and len(i) > 1 else i[0]
        if src in alias:
            for out in o[:1] if name in walks.DERIVED else o:
                alias.setdefault(out, alias[src])
    return alias


@pytest.mark.parametrize("seed", range(8))
def test_copies_of_equal_a_walk_of_every_row(seed):
    rng = np.random.default_rng(seed)
    names = ["aten._to_copy.default", "aten.copy_.default", "aten.clone.default", "aten._weight_norm_interface.default",
             "aten.add.Tensor", "aten.mm.default"]  # fmt: skip
    n = 300
    ops = rng.choice(names, n).tolist()
    ins = [rng.integers(0, 90, rng.integers(1, 3)).tolist() for _ in range(n)]
    outs = [rng.integers(0, 90, rng.integers(1, 3)).tolist() for _ in range(n)]
    sources = set(rng.integers(0, 90, 4).tolist())
    rows = as_rows(pd.DataFrame({"op": ops, "input_storage_ids": ins, "output_storage_ids": outs}))
    found = walks.copies_of(rows, rows.labels("op").map(lambda op: ".".join(op.split(".")[:2])), sources)
    assert found == _reference_copies(ops, ins, outs, sources)
    assert len(found) > len(sources)  # copies were found


# 8. weights of modules outside model= ------------------------------------------------------------
@pytest.mark.parametrize("engine", ["pandas", "sql"])
def test_a_trained_module_outside_the_model_keeps_its_weight_gradients(tmp_path, capsys, engine):
    """model=A, B outside it but trained (a GAN's discriminator with model=G): B's dW = xᵀ @ dL/dy becomes a
    gradient as A's does, and was counted as A's backward weight matmul (making A's backward 4·N·T exactly)."""
    torch.manual_seed(0)
    a, b = nn.Linear(32, 32, bias=False), nn.Linear(32, 32, bias=False)
    opt = torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1)
    x = torch.randn(64, 32)
    path = str(tmp_path / "outside")
    with Tracer(path, model=a, tokens=64):
        for _ in range(3):
            b(a(x)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    frame = reports.breakdown(reports.load(path)).set_index("phase")
    # each matmul [64, 32] @ [32, 32]: 2·64·32·32 = 131,072 FLOPs, per step
    # A: forward 131,072 = 2·N·T; backward dW only (x needs no gradient) 131,072 = 2·N·T
    assert (
        frame.loc["forward", "weight_matmul_flops"] == 131_072
        and frame.loc["backward", "weight_matmul_flops"] == 131_072
    )
    # B: forward 131,072; backward dL/dx + dW = 262,144: all outside the model
    assert frame.loc["forward", "external_weight_flops"] == 131_072
    assert frame.loc["backward", "external_weight_flops"] == 262_144
    from reports.output.cli import main

    main(["report", path, "--engine", engine, "--sections", "explain"])
    out = unwrapped(capsys.readouterr().out)  # explain's lines, wrapped to the width
    assert "Backward weight matmuls: 131,072 FLOPs = 2.00·N·T, not 4·N·T (262,144)" in out
    # SGD updates A's and B's 2 x 1,024 weights, 1 FLOP each (it said 2.0 per parameter over A's 1,024)
    assert "Optimizer: 2,048 FLOPs per step (1.0 per parameter over the 2,048 parameters its steps updated" in out


def test_the_optimizer_line_divides_by_the_parameters_it_updated(tmp_path):
    """LoRA: AdamW updates the low-rank factors only, not the frozen base the model's N counts."""
    torch.manual_seed(0)

    class LoRA(nn.Module):
        def __init__(self):
            super().__init__()
            self.base = nn.Linear(16, 16, bias=False).requires_grad_(False)
            self.a, self.b = nn.Parameter(torch.randn(16, 2)), nn.Parameter(torch.zeros(2, 16))

        def forward(self, x):
            return self.base(x) + x @ self.a @ self.b

    model = LoRA()
    opt = torch.optim.AdamW([model.a, model.b], lr=0.1, foreach=False)
    with Tracer(tmp_path / "lora", model=model, tokens=8) as tr:
        for _ in range(2):
            model(torch.randn(8, 16)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            tr.step()
    df = reports.load(tmp_path / "lora")
    assert next(iter(df.attrs["runs"].values()))["optimizer_params"] == 16 * 2 + 2 * 16 == 64
    line = next(x for x in reports.explain(df) if "Optimizer:" in x)
    # of the model's 256 + 64 = 320 parameters, the 64 of a and b are updated; it said "per parameter over all 320"
    assert "per parameter over the 64 parameters its steps updated" in line


def test_a_frozen_teachers_matmul_is_external_not_attention(tmp_path, capsys):
    torch.manual_seed(0)
    student, teacher = nn.Linear(8, 4, bias=False), nn.Linear(8, 4, bias=False)  # the same class
    teacher.requires_grad_(False)
    x = torch.randn(TOKENS, 8)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    path = str(tmp_path / "distil")
    with Tracer(path, model=student, tokens=TOKENS, run_name="distil"):
        with torch.no_grad():
            target = teacher(x)
        (student(x) - target).square().mean().backward()
        opt.step()
    df = reports.load(path)
    first_mm = df[df["op"].astype(str) == "aten.mm.default"].iloc[0]  # the teacher's x @ Wᵀ runs first
    teacher_weight = int(first_mm["input_storage_ids"][1])
    assert teacher_weight not in {p["storage_id"] for p in df.attrs["runs"]["distil"]["parameters"].values()}
    assert df.attrs["runs"]["distil"]["storage_roles"]["external_parameter"] == [teacher_weight]  # the tracer saw it
    traced = reports.breakdown(df).set_index("phase")
    assert traced.loc["forward", "external_weight_flops"] == 2048 and traced.loc["forward", "attention_flops"] == 0
    # an older trace, made before the tracer recorded the role: the teacher's matmul looked like attention
    old = reports.breakdown(_rewrite(path, roles={"external_parameter": []})).set_index("phase")
    assert old.loc["forward", "attention_flops"] == 2048 and old.loc["forward", "external_weight_flops"] == 0

    t = reports.breakdown(_rewrite(path, roles={"external_parameter": [teacher_weight]})).set_index("phase")
    # each x @ Wᵀ: [32, 8] @ [8, 4]: 2·32·8·4 = 2,048 FLOPs; the teacher's is external, the student's a weight matmul
    assert t.loc["forward", "external_weight_flops"] == 2048
    assert t.loc["forward", "attention_flops"] == 0
    assert t.loc["forward", "weight_matmul_flops"] == 2048
    # N = 4·8 = 32 (the student only): 2·N·T = 2,048; forward = 2 x 2,048 + sub, pow, mean 3 x 128 = 4,480
    assert t.loc["forward", "n_params"] == 32 and t.loc["forward", "expected_flops"] == 2048
    assert t.loc["forward", "flops"] == 4480
    assert t.loc["forward", "ratio"] == (4480 - 2048) / 2048  # the teacher is left out of the ratio
    assert t.loc["total", "external_weight_flops"] == 2048
    text = " ".join(reports.explain(_rewrite(path)))
    assert "Weights outside the model: 2,048 FLOPs per step (2,048 forward)" in text
    # the model's own forward is 4,480 - 2,048 = 2,432 = 1.188 x 2·N·T
    assert "forward 2,432 FLOPs of the model's own (less the weights outside it) = 1.188 x 2·N·T" in text
    from reports.output.cli import main

    assert main(["report", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    flops = report["flops"]
    assert flops["forward"] == 4480 and report["external_weight_flops"] == 2048
    assert flops["forward"] + flops["backward"] + flops["optimizer"] + flops["other"] == flops["total"]
    assert main(["report", path]) == 0
    assert "external_weight_flops" in capsys.readouterr().out


# 7. activation checkpointing's recomputation -----------------------------------------------------
def test_recompute_rows_are_out_of_mfu_and_in_hfu(tmp_path):
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(TOKENS, 8)
    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    path = str(tmp_path / "ckpt")
    with Tracer(path, model=block, tokens=TOKENS, run_name="ckpt"):
        checkpoint(block, x, use_reentrant=False).square().mean().backward()
        opt.step()
    traced = reports.load(path)

    # The backward re-runs the first Linear and the ReLU (and stops there: the second Linear's output is not
    # needed): the backward-phase addmm (2·32·8·16 = 8,192) and relu (32·16 = 512) are the recomputation.
    def again(frame):
        return (frame["phase"] == "backward") & frame["op"].isin(["aten.addmm.default", "aten.relu.default"])

    # the tracer flagged these rows, plus the zero-FLOP t/detach ops of the re-run block
    assert (traced["recompute"] & (traced["flops"] > 0)).tolist() == again(traced).tolist()
    assert int(traced.loc[traced["recompute"], "flops"].sum()) == 8192 + 512
    before = reports.mfu(
        _rewrite(path, recompute=lambda f: f["phase"] != f["phase"]), step_time_s=1.0, peak_flops=1e6
    ).iloc[0]
    df = _rewrite(path, recompute=again)
    assert int(df.loc[df["recompute"], "flops"].sum()) == 8192 + 512
    rate = reports.mfu(df, step_time_s=1.0, peak_flops=1e6).iloc[0]
    # forward: addmm 8,192 + relu 512 + addmm 2·32·16·4 = 4,096 + pow 128 + mean 128 = 13,056
    # backward: 4 x 128 (loss) + 8,704 recomputed + 2 x 4,096 (second Linear) + 128 (its bias) + 512 (ReLU)
    #           + 8,192 (first Linear's dW; x needs no gradient) + 512 (its bias) = 26,752
    # optimizer: SGD adds 8·16 + 16 + 16·4 + 4 = 212
    assert rate["hardware_flops_per_step"] == 13056 + 26752 + 212 == 40020
    assert rate["recompute_flops_per_step"] == 8704
    assert rate["model_flops_per_step"] == 13056 + 26752 - 8704 == 31104
    assert rate["mfu"] == 31104 / 1e6 and rate["hfu"] == 40020 / 1e6
    assert before["model_flops_per_step"] == 39808  # the unflagged trace counted the recomputation
    text = " ".join(reports.explain(df))
    assert "Activation checkpointing: 8,704 FLOPs per step" in text and "8,192 of them weight matmuls" in text


class _CheckpointedBlock(nn.Module):
    """inp, then up -> GELU -> down checkpointed: N = 32·32 + 32·128 + 128·32 = 9,216."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(32, 32, bias=False)
        self.up, self.down = nn.Linear(32, 128, bias=False), nn.Linear(128, 32, bias=False)

    def forward(self, x):
        h = self.inp(x)
        return h + checkpoint(lambda h: self.down(nn.functional.gelu(self.up(h))), h, use_reentrant=False)


def test_a_checkpointed_blocks_last_weight_is_active_under_autocast(tmp_path):
    """Under bf16 autocast the re-run casts the weights again and stops before `down` (nothing needs its output):
    the dL/dh of `down` reads the re-run's cast of down.weight, not the forward's. That cast is the weight."""
    torch.manual_seed(0)
    model = _CheckpointedBlock()
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    x, y = torch.randn(16, 32), torch.randn(16, 32)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        nn.functional.mse_loss(out.float(), y).backward()
        opt.step()
        opt.zero_grad()

    step()
    path = str(tmp_path / "ckpt_bf16")
    with Tracer(path, model=model, tokens=16):
        step()
    df = reports.load(path)
    total = reports.breakdown(df).set_index("phase").loc["total"]
    assert total["n_params"] == 9216
    assert total["n_active"] == 9216  # was 5,120: down.weight (4,096) left out
    assert total["active_ratio"] == total["ratio"]
    text = " ".join(reports.explain(df))
    assert "Weights partly used" not in text and "without a backward" not in text


def test_a_frozen_teachers_weights_are_parameters_in_memory(tmp_path):
    torch.manual_seed(0)
    student, teacher = nn.Linear(8, 4, bias=False), nn.Linear(16, 8, bias=False)
    teacher.requires_grad_(False)
    x = torch.randn(TOKENS, 16)
    with Tracer(tmp_path / "distil", model=student, tokens=TOKENS):
        with torch.no_grad():
            h = teacher(x)
        student(h).sum().backward()
    df = reports.load(tmp_path / "distil")
    cats = reports.by_category(df, at="end").set_index("category")["bytes"]
    # student 4·8 + teacher 8·16 float32 weights: 128 + 512 = 640 bytes; the batch x, 32·16·4 = 2,048, is an input
    assert cats["parameters"] == 4 * 8 * 4 + 8 * 16 * 4 == 640
    assert cats["inputs"] == TOKENS * 16 * 4 == 2048
    assert reports.breakdown(df)["n_params"].iloc[0] == 32  # N stays the student's


class _BackwardGram(torch.autograd.Function):
    """Forward: a * b elementwise; backward: also matmuls of activations only, (a @ aᵀ) @ a, scaled by 0."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return grad * b + (a @ a.T) @ a * 0, grad * a


def test_activation_matmuls_only_in_the_backward_get_their_own_explain_line(tmp_path):
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4, 4))

        def forward(self, x):
            return _BackwardGram.apply(x, self.w)

    model, x = Scale(), torch.randn(4, 4, requires_grad=True)
    with Tracer(tmp_path / "gram", model=model, tokens=4):
        model(x).sum().backward()
    df = reports.load(tmp_path / "gram")
    t = reports.breakdown(df, n=16).set_index("phase")
    # two [4, 4] @ [4, 4] matmuls, 2·4·4·4 = 128 FLOPs each, in the backward only; none in the forward
    assert t.loc["forward", "attention_flops"] == 0 and t.loc["backward", "attention_flops"] == 256
    text = " ".join(reports.explain(df, n=16))
    assert "Activation x activation matmuls in the backward only: 256 FLOPs" in text
    assert "4·T·(L·S·d)" not in text


# weights used through views: slices, split, chunk, select, MultiheadAttention, per-sample gradients ----
@pytest.mark.parametrize(
    "ops, weight_gradient",
    [
        (["aten.slice_backward.default"], True),  # dL/dw[:, :k] placed into zeros of w's shape
        (["aten.select_backward.default", "aten.add.Tensor"], True),  # w[e] of two experts, summed
        (["aten.index_put.default"], True),  # w[expert_ids]: the gathered gradients put back (accumulate=True)
        (["aten.cat.default"], True),  # w.split / w.chunk: the pieces' gradients concatenated
        (["aten._to_copy.default", "aten.slice_backward.default", "aten.add_.Tensor"], True),
        (["aten.mul.Tensor", "aten.slice_backward.default"], False),  # a product is not a placed gradient
        (["aten.slice_backward.default", "aten.embedding_dense_backward.default"], False),
    ],
)
def test_gradient_sources_follow_the_ops_that_place_a_slices_gradient(ops, weight_gradient):
    rows = _hops(ops)
    packets = rows["op"].map(lambda op: ".".join(op.split(".")[:2]))
    assert (0 in gradient_sources(rows, packets, {len(ops)})) is weight_gradient


class Views(nn.Module):
    """x @ (a view of a parameter): w [4, 8] sliced, split or chunked; e [3, 4, 4] selected."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.w = nn.Parameter(torch.randn(4, 8))
        self.e = nn.Parameter(torch.randn(3, 4, 4))

    def forward(self, x):
        if self.how == "slice":
            return (x @ self.w[:, :4]).sum()
        if self.how == "split":
            a, b = self.w.split(4, dim=1)
            return (x @ a + x @ b).sum()
        if self.how == "chunk":
            a, b = self.w.chunk(2, dim=1)
            return (x @ a * (x @ b)).sum()
        return (x @ self.e[1]).sum()


@pytest.mark.parametrize("how, matmuls", [("slice", 1), ("split", 2), ("chunk", 2), ("select", 1)])
def test_a_matmul_with_a_view_of_a_weight_is_a_weight_matmul_both_ways(tmp_path, how, matmuls):
    torch.manual_seed(0)
    model = Views(how)
    with Tracer(tmp_path / how, model=model, tokens=8):
        model(torch.randn(8, 4)).backward()
    df = reports.load(tmp_path / how)
    t = reports.breakdown(df).set_index("phase")
    # each x @ piece: [8, 4] @ [4, 4] = 2·8·4·4 = 256 FLOPs; its dL/dpiece = xᵀ @ dL/dy the same (x is data)
    assert t.loc["forward", "weight_matmul_flops"] == t.loc["backward", "weight_matmul_flops"] == 256 * matmuls
    assert t.loc["backward", "attention_flops"] == 0
    text = " ".join(reports.explain(df))
    assert "double backward" not in text and "Activation x activation" not in text
    # N_active: the slice uses 16 of w's 32 parameters, w[e] 16 of e's 48; split and chunk use all of w
    assert t.loc["total", "n_active"] == {"slice": 16, "split": 32, "chunk": 32, "select": 16}[how]


def test_multihead_attention_with_separate_query_and_key_value_inputs(tmp_path):
    torch.manual_seed(0)
    model = nn.MultiheadAttention(4, 2, bias=False)  # in_proj_weight [12, 4]: q rows 0-3, k/v rows 4-11
    q, kv = torch.randn(8, 1, 4), torch.randn(6, 1, 4)  # 8 queries, 6 keys/values
    with Tracer(tmp_path / "mha", model=model, tokens=8):
        model(q, kv, kv)[0].sum().backward()
    df = reports.load(tmp_path / "mha")
    t = reports.breakdown(df).set_index("phase")
    # forward: q 2·8·4·4 = 256 + k/v 2·6·4·8 = 384 (the slices of in_proj_weight) + out_proj 2·8·4·4 = 256 = 896
    assert t.loc["forward", "weight_matmul_flops"] == 896
    # backward: the three dL/dW (896) + out_proj's dL/dx (256); q and kv are data: no dL/dx for in_proj
    assert t.loc["backward", "weight_matmul_flops"] == 896 + 256 == 1152
    # attention, 2 heads of width 2: q @ kᵀ 2·2·8·6·2 = 384 and P @ v 384 forward; 4 x 384 backward
    assert t.loc["forward", "attention_flops"] == 768 and t.loc["backward", "attention_flops"] == 1536
    # N = 48 + 16 = 64; N_active: in_proj's q rows (16) meet 8 tokens, its k/v rows (32) 6 of T = 8: 16 + 24 + 16 = 56
    assert t.loc["total", "n_params"] == 64 and t.loc["total", "n_active"] == 56


def test_per_sample_gradients_with_vmap_are_weight_gradient_matmuls(tmp_path):
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    model = nn.Linear(4, 3, bias=False)
    x, y = torch.randn(8, 4), torch.randn(8, 3)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        return (functional_call(model, p, (xi[None],)) - yi[None]).square().sum()

    with Tracer(tmp_path / "vmap", model=model, tokens=8):
        per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    assert per_sample["weight"].shape == (8, 3, 4)  # one [3, 4] gradient per sample, never a .grad
    df = reports.load(tmp_path / "vmap")
    t = reports.breakdown(df).set_index("phase")
    # forward: the batched x @ Wᵀ, [8, 4] @ [4, 3] = 2·8·4·3 = 192; backward: the per-sample dL/dW, a bmm
    # [8, 3, 1] @ [8, 1, 4] = 2·8·3·1·4 = 192 whose output has W's shape [3, 4] per sample
    assert t.loc["forward", "weight_matmul_flops"] == t.loc["backward", "weight_matmul_flops"] == 192
    assert t.loc["backward", "attention_flops"] == 0
    assert "double backward" not in " ".join(reports.explain(df))
    # the output shapes read as Arrow lists give the same table
    pd.testing.assert_frame_equal(
        reports.breakdown(reports.load(tmp_path / "vmap", lists="arrow")), reports.breakdown(df)
    )


@pytest.mark.parametrize("reentrant", [True, False])
def test_a_checkpointed_forward_is_training_work(tmp_path, reentrant):
    """Checkpointing saves no activations (the reentrant forward even runs under no_grad), and the
    non-reentrant early stop re-runs only up to the last Linear: the forward is still training's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8), nn.GELU(), nn.Linear(8, 4))
    x = torch.randn(TOKENS, 8, requires_grad=True)
    with Tracer(tmp_path / "ckpt", model=model, tokens=TOKENS):
        checkpoint(model, x, use_reentrant=reentrant).sum().backward()
    df = reports.load(tmp_path / "ckpt")
    t = reports.breakdown(df).set_index("phase")
    # N = 8·16 + 16·8 + 8·4 = 288, each weight used once per token: 2·288·32 = 18,432 = 2·N·T
    assert t.loc["total", "n_active"] == t.loc["total", "n_params"] == 288
    text = " ".join(reports.explain(df))
    assert "Forward weight matmuls: 18,432 FLOPs = 2.00·N·T" in text and "without a backward" not in text
