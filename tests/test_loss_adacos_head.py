"""AdaCos, fixed scale (AdaCosHead) and dynamic scale (AdaCosDynamicHead, eq. 14-15 of Zhang
2019): value and gradient against loops over the formulas; the dynamic scale's update rule
(B_avg, median angle), when it runs (training only) and what it keeps."""

import math

import pytest
import torch
from loss_utils import head_and_reference, random_class_batch

from sslkit.losses.adacos import AdaCosHead, adacos_fixed_scale
from sslkit.losses.adacos_dynamic import AdaCosDynamicHead


def cosines(x, weight):
    return [
        [
            (x[i] @ weight[j]) / (torch.sqrt(x[i] @ x[i]) * torch.sqrt(weight[j] @ weight[j]))
            for j in range(len(weight))
        ]
        for i in range(len(x))
    ]


def scaled_softmax_reference(x, weight, labels, s):
    """mean_i -log( e^{s cos_y} / sum_j e^{s cos_j} ), loops, float64."""
    cos = cosines(x, weight)
    losses = [-s * cos[i][labels[i]] + torch.log(sum(torch.exp(s * c) for c in cos[i])) for i in range(len(x))]
    return torch.stack(losses).mean()


def dynamic_scale_reference(x, weight, labels, s_old):
    """Eq. 15: s = log(B_avg) / cos(min(pi/4, theta_med)), B_avg = mean_i sum_{j != y_i} e^{s_old cos_ij}."""
    with torch.no_grad():
        cos = cosines(x, weight)
        b = [
            sum(math.exp(s_old * float(cos[i][j])) for j in range(len(weight)) if j != labels[i])
            for i in range(len(x))
        ]
        b_avg = sum(b) / len(b)
        angles = sorted(math.acos(float(cos[i][labels[i]])) for i in range(len(x)))
        theta_med = angles[(len(angles) - 1) // 2]  # torch.median: the lower middle value
        s_new = math.log(b_avg) / math.cos(min(math.pi / 4, theta_med))
        return s_new if s_new > 0 else s_old  # B_avg <= 1 (tiny batches, few classes): keep s


@pytest.mark.parametrize("n,d,c", [(1, 3, 3), (6, 5, 4), (9, 8, 12)])
def test_fixed_scale_matches_reference(n, d, c):
    head = AdaCosHead(d, c).double()
    assert head.scale == pytest.approx(math.sqrt(2) * math.log(c - 1))
    x, labels = random_class_batch(n, d, c, seed=n * c)
    ours, ref = head_and_reference(head, x, labels, scaled_softmax_reference, s=math.sqrt(2) * math.log(c - 1))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_fixed_scale_value():
    assert adacos_fixed_scale(10_000) == pytest.approx(13.0252, abs=1e-4)


@pytest.mark.parametrize("n,d,c", [(1, 3, 3), (6, 5, 4), (9, 8, 12)])
def test_dynamic_scale_update_and_loss_match_reference(n, d, c):
    torch.manual_seed(n + c)  # the head's initial weights
    head = AdaCosDynamicHead(d, c).double().train()
    x, labels = random_class_batch(n, d, c, seed=n + c)
    for _ in range(2):  # the second step starts from the first step's scale
        s_old = float(head.s)
        s_new = dynamic_scale_reference(x, head.weight.detach(), labels, s_old)
        head.weight.grad = None
        # This batch is scored with the scale computed from it; no gradient flows through s.
        ours, ref = head_and_reference(head, x, labels, scaled_softmax_reference, s=s_new)
        assert float(head.s) == pytest.approx(s_new, rel=1e-10)
        for a, b in zip(ours, ref):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("s_old", [30.0, 120.0])
def test_dynamic_scale_in_fp32_at_a_scale_whose_exp_overflows(s_old):
    """B_avg in fp32: at s(t-1) = 120, e^{s cos} overflows fp32 (e^88), so the sum runs with the
    largest logit shifted out; at 30 it runs plain. Either way s(t) is eq. 15's, and the loss
    (scored after the target column was masked and put back) is finite."""
    torch.manual_seed(3)
    head = AdaCosDynamicHead(8, 12).train()
    x, labels = random_class_batch(20, 8, 12, seed=5)
    x = x.float()
    with torch.no_grad():
        head.s.fill_(s_old)
    expected = dynamic_scale_reference(x.double(), head.weight.detach().double(), labels, s_old)
    loss = head(x, labels)
    assert torch.isfinite(loss)
    assert float(head.s) == pytest.approx(expected, rel=1e-5)
    ref_loss = scaled_softmax_reference(x.double(), head.weight.detach().double(), labels, float(head.s))
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-4)


def test_dynamic_head_reuses_its_workspace_and_overlapping_calls_stay_exact():
    """The two-step path (cosine logits, then the loss) borrows the head's workspace: a second
    training step reuses the same buffers, and two losses alive at once (eval mode, fixed s, one
    backward for both) each get their own and match the formula."""
    torch.manual_seed(4)
    head = AdaCosDynamicHead(8, 12).double().train()
    (x1, y1), (x2, y2) = random_class_batch(10, 8, 12, seed=1), random_class_batch(10, 8, 12, seed=2)
    head(x1, y1).backward()
    kept = {name: buffer.data_ptr() for name, buffer in head.workspace._free.items()}
    assert {"logits", "weight_grad", "logits_exp"} <= set(kept)
    head(x2, y2).backward()  # the same memory again
    assert {name: buffer.data_ptr() for name, buffer in head.workspace._free.items()} == kept

    head.eval()
    s = float(head.s)
    a, b = x1.clone().requires_grad_(True), x2.clone().requires_grad_(True)
    head.zero_grad(set_to_none=True)
    (head(a, y1) + head(b, y2)).backward()
    a2, b2 = x1.clone().requires_grad_(True), x2.clone().requires_grad_(True)
    w2 = head.weight.detach().clone().requires_grad_(True)
    (scaled_softmax_reference(a2, w2, y1, s) + scaled_softmax_reference(b2, w2, y2, s)).backward()
    torch.testing.assert_close((a.grad, b.grad, head.weight.grad), (a2.grad, b2.grad, w2.grad), rtol=1e-9, atol=1e-11)


def test_dynamic_scale_moves_in_training_only_and_is_saved():
    head = AdaCosDynamicHead(8, 5)
    x, labels = torch.randn(16, 8), torch.randint(0, 5, (16,))
    initial = float(head.s)
    assert initial == pytest.approx(adacos_fixed_scale(5))
    head.eval()
    loss_eval = head(x, labels)
    head.logits(x)
    assert float(head.s) == initial
    fixed = AdaCosHead(8, 5)
    with torch.no_grad():
        fixed.weight.copy_(head.weight)
    torch.testing.assert_close(loss_eval, fixed(x, labels))  # s(0) is the fixed AdaCos scale
    head.train()
    head(x, labels)
    assert float(head.s) != initial
    assert "s" in head.state_dict() and float(head.state_dict()["s"]) == float(head.s)
    cos = torch.nn.functional.normalize(x) @ torch.nn.functional.normalize(head.weight).T
    torch.testing.assert_close(head.logits(x), float(head.s) * cos)


def test_degenerate_batch_keeps_the_previous_scale():
    # Every other class at cos = -1 and a large old scale: B_avg = 2 e^{-s} < 1, so eq. 15 gives s < 0.
    head = AdaCosDynamicHead(2, 3).double()
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64))
        head.s.fill_(13.0)
    loss = head(torch.tensor([[2.0, 0.0]], dtype=torch.float64), torch.tensor([0]))
    assert float(head.s) == 13.0 and torch.isfinite(loss)


@pytest.mark.parametrize("cls", [AdaCosHead, AdaCosDynamicHead])
def test_rejects_fewer_than_three_classes(cls):
    with pytest.raises(ValueError, match="num_classes"):
        cls(4, 2)
