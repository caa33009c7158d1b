"""reports.explain's words on weights that multiply more than T tokens: a layer shared across depth, forward passes
run several times in one step."""

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import reports
from tracer import Tracer


# ------------------------------------------------------------------ explain: a layer shared across depth
class SharedDepth(nn.Module):
    """One layer applied 3 times (ALBERT's sharing across depth), then a head: N = 16·16 + 16·2 = 288."""

    def __init__(self):
        super().__init__()
        self.layer, self.head = nn.Linear(16, 16, bias=False), nn.Linear(16, 2, bias=False)

    def forward(self, x):
        for _ in range(3):
            x = torch.relu(self.layer(x))
        return self.head(x)


def test_explain_on_a_layer_called_three_times_does_not_only_doubt_tokens(tmp_path):
    """The shared layer multiplies 3·T tokens: before, explain asked only whether tokens= was the tokens per step
    (it is); a whole multiple of T names the layer called k times as the other answer."""
    torch.manual_seed(0)
    net, x = SharedDepth(), torch.randn(4, 16)
    with Tracer(tmp_path / "t", model=net, tokens=4):
        net(x).sum().backward()
    with FlopCounterMode(display=False) as counter:
        net(x)
    text = "\n".join(reports.explain(reports.load(tmp_path / "t")))
    # forward: 3 x 2·4·16·16 = 6,144 + head 2·4·16·2 = 256 = 6,400
    assert counter.get_total_flops() == 6400 and "Forward weight matmuls: 6,400 FLOPs" in text
    assert "layer.weight 3.00x (12 tokens)" in text  # 3 calls x 4 rows
    assert (
        "256 of the N = 288 parameters multiplied 12 tokens per step each: is tokens= (4) the tokens per step, "
        "or is each of them called 3 times a step (a layer shared across depth)?"
    ) in text


def test_explain_on_forward_passes_in_one_step_names_tracer_step(tmp_path):
    """A forward-only loop with no Tracer.step() is one step (no backward or optimizer step ends one): explain's
    question on the tokens adds the passes as an answer, and with step() after each pass each pass is a step of
    exactly 2·N·T. Linear(16, 32) and Linear(32, 16) on 8 rows: N = 16·32 + 32·16 = 1,024."""
    torch.manual_seed(0)
    net, x = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)), torch.randn(8, 16)
    for stepped in (False, True):
        with torch.no_grad(), Tracer(tmp_path / f"t{stepped}", model=net, tokens=8) as tr:
            for _ in range(5):
                net(x)
                if stepped:
                    tr.step()
        df = reports.load(tmp_path / f"t{stepped}")
        text = "\n".join(reports.explain(df))
        forward = reports.breakdown(df).set_index("phase").loc["forward"]
        if not stepped:
            # 5 passes x 2·8·1,024 = 81,920 weight-matmul FLOPs in the one step: 10.00·N·T
            assert "Forward weight matmuls: 81,920 FLOPs = 10.00·N·T" in text
            assert (
                "is tokens= (8) the tokens per step, or is each of them called 5 times a step (a layer shared "
                "across depth, or 5 forward passes in one step: call Tracer.step() after each pass)?"
            ) in text
        else:
            # per step: 2·8·1,024 = 16,384, ratio 1 to 2·N·T
            assert "Forward weight matmuls: 16,384 FLOPs = 2.00·N·T" in text and "forward passes" not in text
            assert forward["expected_flops"] == 16384 and forward["weight_matmul_flops"] == 16384


def test_explain_residual_names_the_other_phase_apart_from_the_other_ops_line(tmp_path):
    """Gradient clipping runs between the backward and the optimizer step (the other phase): the residual's terms
    add up to it, and its other ops are the "Other ops" line's forward + backward figure, the clipping apart (they
    were one 581 beside the line's 64)."""
    torch.manual_seed(0)
    net, x = nn.Linear(16, 16, bias=False), torch.randn(4, 16)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with Tracer(tmp_path / "t", model=net, tokens=4):
        net(x).sum().backward()
        nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
    text = "\n".join(reports.explain(reports.load(tmp_path / "t")))
    # all phases: forward mm 2·4·16·16 = 2,048 + sum 64, backward mm 2,048, clipping _foreach_norm 256 +
    # vector norm, add, reciprocal, mul, clamp 1 each + _foreach_mul_ 256 = 517, SGD's add_ 256: 4,933;
    # 6·N·T = 6 x 256 x 4 = 6,144; residual -1,211 = (4,096 - 6,144) + 0 + 64 + 517 + 256
    assert (
        "Residual: all phases - 6·N·T = -1,211 FLOPs = weight matmuls - 6·N·T (-2,048) + attention (0) + other ops "
        "(64) + the other phase's (517: outside forward, backward and the optimizer step, as gradient clipping) + "
        "the optimizer (256)."
    ) in text
    assert "Other ops: 64 FLOPs in forward + backward" in text
