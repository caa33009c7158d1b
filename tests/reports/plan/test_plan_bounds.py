"""Planning a large job from one rank: what the plan and the report say about figures that are
only bounds (grouped matmuls under meta or fake tensors, whose group sizes cannot be read).

A tiny mixture-of-experts step on the meta device: T = 16 tokens, width K = 8, E = 4 experts of
width F = 8, every token routed once (x [16, 8] @ w [4, 8, 8] with meta offsets), x needing a
gradient so that both dL/dx and dL/dW are computed:
    forward  _grouped_mm [16, 8] @ [4, 8, 8]: 2 * 16 * 8 * 8 = 2,048 FLOPs, flagged a bound
    backward dL/dx [16, 8] @ [4, 8, 8]ᵀ and dL/dW [8, 16] @ [16, 8] grouped: 2,048 each
    = 6,144 FLOPs per step, all of them upper bounds
"""

import json

import torch
from torch import nn

import reports
from reports.output.cli import main
from tracer import Tracer

T, K, F, E = 16, 8, 8, 4
BOUND = 3 * 2 * T * K * F  # 6,144: the forward and both backward grouped matmuls, 2 * 16 * 8 * 8 each


class MetaExperts(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(E, K, F, dtype=torch.bfloat16, device="meta"))

    def forward(self, x, offs):
        return torch._grouped_mm(x, self.w, offs=offs)


def trace_meta_experts(path):
    model = MetaExperts()
    x = torch.empty(T, K, dtype=torch.bfloat16, device="meta", requires_grad=True)
    offs = torch.empty(E, dtype=torch.int32, device="meta")
    with Tracer(path, model=model, tokens=T):
        model(x, offs).backward(torch.empty(T, F, dtype=torch.bfloat16, device="meta"))  # a contiguous dL/dy
    return reports.load(path)


def test_plan_names_the_flops_that_are_upper_bounds(tmp_path, capsys):
    df = trace_meta_experts(tmp_path / "moe")
    rows = df[df["op"] == "aten._grouped_mm.default"]
    assert rows["flops"].tolist() == [2048] * 3 and rows["flops_bound"].all()  # 2 * 16 * 8 * 8 each
    frame = reports.plan(df, gpu="H100 SXM")
    assert frame["bound_flops_per_step"].tolist() == [BOUND] == [6144]
    notes = frame.attrs["plan"][frame["run"][0]]["notes"]
    (line,) = [n for n in notes if "upper bound" in n]
    assert "3 ops" in line and "6,144 FLOPs per step" in line and "flops_bound" in line
    assert main(["plan", str(tmp_path / "moe"), "--gpu", "H100 SXM", "--json"]) in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["bound_flops_per_step"] == 6144 and line in out["notes"]
    main(["plan", str(tmp_path / "moe"), "--gpu", "B200"])
    assert "6,144 FLOPs per step" in capsys.readouterr().out


def test_plan_of_exact_flops_has_no_bound_note(tmp_path):
    model = nn.Linear(K, F, bias=False, device="meta", dtype=torch.bfloat16)
    with Tracer(tmp_path / "dense", model=model, tokens=T):
        model(torch.empty(T, K, dtype=torch.bfloat16, device="meta")).sum().backward()
    frame = reports.plan(reports.load(tmp_path / "dense"), gpu="H100 SXM")
    assert frame["bound_flops_per_step"].tolist() == [0]
    assert not [n for n in frame.attrs["plan"][frame["run"][0]]["notes"] if "upper bound" in n]


def test_n_active_measured_from_bound_flops_is_called_a_bound(tmp_path, capsys):
    """N = 4 * 8 * 8 = 256 expert parameters; the forward's bound 2,048 FLOPs = 2 * 256 * 16 * share gives share 1/4,
    N_active = 64: exact only if every token is routed, which meta offsets cannot show."""
    df = trace_meta_experts(tmp_path / "moe")
    t = reports.breakdown(df).set_index("phase")
    assert (t.loc["total", "n_params"], t.loc["total", "n_active"]) == (256, 64)
    (line,) = [str(x) for x in reports.explain(df) if "N_active = 64" in str(x) and "parameters, of which" in str(x)]
    assert "N_active is an upper bound" in line and "flops_bound" in line
    main(["report", str(tmp_path / "moe"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["n_active"] == 64 and any("N_active is an upper bound" in x for x in out["breakdown"]["explain"])


def test_n_active_of_readable_offsets_is_not_called_a_bound(tmp_path):
    torch.manual_seed(0)
    model = MetaExperts()
    model.w = nn.Parameter(torch.randn(E, K, F, dtype=torch.bfloat16))
    x = torch.randn(T, K, dtype=torch.bfloat16, requires_grad=True)
    offs = torch.tensor([2, 6, 8, 16], dtype=torch.int32)  # all 16 tokens routed, 2 + 4 + 2 + 8
    with Tracer(tmp_path / "cpu", model=model, tokens=T):
        model(x, offs).backward(torch.ones(T, F, dtype=torch.bfloat16))
    df = reports.load(tmp_path / "cpu")
    assert reports.breakdown(df).set_index("phase").loc["total", "n_active"] == 64  # 256 * 16 / (4 * 16)
    assert not [x for x in reports.explain(df) if "upper bound" in str(x) and "N_active" in str(x)]


class TiedLM(nn.Module):
    """An embedding whose weight is also the head's (GPT-2's tied head): V = 64 words of width D = 16."""

    def __init__(self, tied):
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.head = None if tied else nn.Linear(16, 64, bias=False)

    def forward(self, x):
        h = self.emb(x)
        return h @ self.emb.weight.t() if self.head is None else self.head(h)


def _tied_plan(tmp_path, tied):
    torch.manual_seed(0)
    model = TiedLM(tied)
    x = torch.randint(0, 64, (2, 4))  # B x S = 8 tokens: logits [8, 64] hold 2,048 bytes, not a weight's 4,096
    with Tracer(tmp_path / f"tied-{tied}", model=model, tokens=8):
        nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    return reports.plan(reports.load(tmp_path / f"tied-{tied}"), gpu="H100 SXM")


def test_weight_sized_backward_temporaries_make_the_largest_micro_batch_a_lower_bound(tmp_path):
    # The tied weight's two gradients, the head's (mm) and the embedding's (embedding_dense_backward), are
    # temporaries of the weight's size until autograd adds them: 64 x 16 x 4 = 4,096 bytes each, 8,192 together.
    # They do not grow with the micro-batch; the fit counts them as growing (it cannot tell), so its largest
    # micro-batch is a lower bound, and the plan gives the figure were they fixed beside it.
    frame = _tied_plan(tmp_path, tied=True)
    memory = frame.attrs["plan"][frame["run"][0]]["memory"]
    assert memory["parameter_sized_bytes"] == 8192  # 2 x 64 x 16 x 4
    assert memory["max_micro_batch_if_fixed"] > frame["max_micro_batch"][0] > 0
    notes = frame.attrs["plan"][frame["run"][0]]["notes"]
    (line,) = [n for n in notes if "lower bound" in n]
    assert f"({frame['max_micro_batch'][0]})" in line and "8,192 bytes" in line
    assert f"up to {memory['max_micro_batch_if_fixed']} fit" in line


def test_an_untied_head_gives_no_lower_bound_note(tmp_path):
    # Untied, the head's weight gradient (mm) is the gradient itself (autograd keeps it as .grad), and the
    # embedding's likewise: no temporary of a weight's size is left growing
    frame = _tied_plan(tmp_path, tied=False)
    memory = frame.attrs["plan"][frame["run"][0]]["memory"]
    assert memory["max_micro_batch_if_fixed"] is None
    assert not [n for n in frame.attrs["plan"][frame["run"][0]]["notes"] if "lower bound" in n]


def test_autocasts_bf16_weight_gradients_make_the_largest_micro_batch_a_lower_bound(tmp_path):
    # Two Linear(64, 64) under bf16 autocast: each weight's gradient is an mm in bf16 (64 x 64 x 2 = 8,192 bytes), a
    # temporary until its copy to float32 becomes .grad; counted as growing, as the fp32 ones of the tied head are
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64, bias=False), nn.Linear(64, 64, bias=False))
    with Tracer(tmp_path / "t", model=model, tokens=4):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 64)).float().square().mean()
        loss.backward()
    frame = reports.plan(reports.load(tmp_path / "t"), gpu="H100 SXM")
    memory = frame.attrs["plan"][frame["run"][0]]["memory"]
    assert memory["parameter_sized_bytes"] == 8192  # one live at a time: 64 x 64 x 2 (none were flagged: 0)
    assert memory["max_micro_batch_if_fixed"] > frame["max_micro_batch"][0] > 0
