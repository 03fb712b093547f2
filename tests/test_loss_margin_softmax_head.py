"""What every classification head shares: the interface (logits, param_groups, label checks),
dtype handling, half-precision autocast, and the two autograd functions of the margin-softmax
base (in-place cross-entropy with a changed target logit, cosine logits)."""

import math

import pytest
import torch
import torch.nn.functional as F

from sslkit.losses import margin_softmax
from sslkit.losses._workspace import Workspace
from sslkit.losses.adacos import AdaCosHead
from sslkit.losses.adacos_dynamic import AdaCosDynamicHead
from sslkit.losses.arcface import ArcFaceHead, arcface_target_logit
from sslkit.losses.coco import CoCoHead
from sslkit.losses.cosface import CosFaceHead
from sslkit.losses.lsoftmax import LSoftmaxHead
from sslkit.losses.margin_softmax import (
    _scaled_unit_rows,
    cosine_logits,
    cosine_margin_cross_entropy,
    margin_cross_entropy,
)
from sslkit.losses.normsoftmax import NormSoftmaxHead
from sslkit.losses.proxy_anchor import ProxyAnchorHead
from sslkit.losses.proxy_nca import ProxyNCAHead
from sslkit.losses.softmax import SoftmaxHead
from sslkit.losses.sphereface import SphereFaceHead

HEADS = [
    (SoftmaxHead, {}),
    (NormSoftmaxHead, {}),
    (CoCoHead, {}),
    (LSoftmaxHead, {}),
    (SphereFaceHead, {}),
    (CosFaceHead, {}),
    (ArcFaceHead, {}),
    (ArcFaceHead, {"easy_margin": True}),
    (AdaCosHead, {}),
    (AdaCosDynamicHead, {}),
]
IDS = [cls.__name__ + ("-easy" if kw else "") for cls, kw in HEADS]


@pytest.mark.parametrize("cls,kwargs", HEADS, ids=IDS)
def test_logits_shape_and_loss_is_scalar(cls, kwargs):
    head = cls(12, 7, **kwargs)
    x, y = torch.randn(5, 12), torch.randint(0, 7, (5,))
    assert head.num_classes == 7
    assert head.logits(x).shape == (5, 7)
    loss = head(x, y)
    assert loss.shape == () and torch.isfinite(loss)


@pytest.mark.parametrize("cls,kwargs", HEADS, ids=IDS)
def test_param_groups_cover_every_parameter_exactly_once(cls, kwargs):
    head = cls(12, 7, **kwargs)
    groups = head.param_groups()
    listed = [id(p) for g in groups for p in g["params"]]
    assert sorted(listed) == sorted(id(p) for p in head.parameters())
    assert len(listed) == len(set(listed))
    assert all(isinstance(g["lr_scale"], float) and isinstance(g["name"], str) for g in groups)
    # The groups really build an optimizer, and a step moves the class weights.
    opt = torch.optim.SGD([{"params": g["params"], "lr": 0.1 * g["lr_scale"]} for g in groups])
    before = head.weight.detach().clone()
    head(torch.randn(6, 12), torch.randint(0, 7, (6,))).backward()
    opt.step()
    assert not torch.equal(before, head.weight.detach())


@pytest.mark.parametrize("cls,kwargs", HEADS, ids=IDS)
@pytest.mark.parametrize("bad", [-1, 7])
def test_labels_out_of_range_raise(cls, kwargs, bad):
    head = cls(12, 7, **kwargs)
    labels = torch.tensor([0, bad, 3])
    with pytest.raises(ValueError, match=r"labels.*num_classes.*\[0, 7\)"):
        head(torch.randn(3, 12), labels)


@pytest.mark.parametrize("cls,kwargs", HEADS, ids=IDS)
def test_bad_shapes_raise(cls, kwargs):
    head = cls(12, 7, **kwargs)
    with pytest.raises(ValueError, match="embedding_dim"):
        head(torch.randn(3, 11), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="labels"):
        head(torch.randn(3, 12), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="labels"):
        head(torch.randn(3, 12), torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="labels are required"):
        head(torch.randn(3, 12), None)
    with pytest.raises(ValueError, match="embeddings"):
        head.logits(torch.randn(3, 12, 1))


@pytest.mark.parametrize("cls", [cls for cls, _ in HEADS[:-2]] + [AdaCosHead])
@pytest.mark.parametrize("name,value", [("embedding_dim", 0), ("num_classes", 0), ("num_classes", 2.5)])
def test_bad_sizes_raise(cls, name, value):
    sizes = {"embedding_dim": 12, "num_classes": 7, name: value}
    with pytest.raises(ValueError, match=name):
        cls(**sizes)


@pytest.mark.parametrize("cls,kwargs", HEADS, ids=IDS)
def test_float64_stays_float64_and_float32_weights_follow_the_input(cls, kwargs):
    head = cls(12, 7, **kwargs)
    x, y = torch.randn(5, 12, dtype=torch.float64), torch.randint(0, 7, (5,))
    assert head(x, y).dtype == torch.float64  # fp32 weights promoted, not the input demoted
    assert head.double()(x, y).dtype == torch.float64


@pytest.mark.parametrize("cls,kwargs", HEADS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_is_finite_and_close(cls, kwargs, dtype):
    torch.manual_seed(0)
    head = cls(32, 50, **kwargs).eval()  # eval: AdaCos's dynamic scale must not move between calls
    x, y = torch.randn(64, 32), torch.randint(0, 50, (64,))
    expected = head(x, y)
    x_half = x.to(dtype).requires_grad_(True)
    with torch.autocast("cpu", dtype=dtype):
        got = head(x_half, y)
        logits = head.logits(x_half)
    got.backward()
    assert got.dtype == torch.float32 and logits.dtype == torch.float32
    assert torch.isfinite(got) and torch.isfinite(x_half.grad).all() and torch.isfinite(head.weight.grad).all()
    # What is left is the embeddings' own rounding to half precision (|loss| is up to ~100 at s = 64).
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_scale_64_with_confident_embeddings_is_finite(dtype):
    # Embeddings on their class weight: target logit 64 cos(m), others near 0 -> large logit gaps.
    head = ArcFaceHead(16, 10)
    y = torch.arange(10)
    x = (head.weight.detach()[y] * 3).to(dtype).requires_grad_(True)
    with torch.autocast("cpu", dtype=dtype):
        loss = head(x, y)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all() and torch.isfinite(head.weight.grad).all()


def _identity(cos):
    return cos


@pytest.mark.parametrize("radius", [1.0, 30.0])
def test_margin_cross_entropy_without_margin_is_cross_entropy(radius):
    logits = torch.randn(6, 9, dtype=torch.float64) * 3
    labels = torch.tensor([0, 8, 3, 3, 5, 1])
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    ours = margin_cross_entropy(a * 1.0, labels, _identity, radius)  # "* 1.0": the function overwrites its input
    ours.backward()
    theirs = F.cross_entropy(b, labels)
    theirs.backward()
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12)


def test_margin_cross_entropy_differentiates_the_target_change_and_radius():
    torch.manual_seed(1)
    cos = (torch.rand(5, 4, dtype=torch.float64) * 1.8 - 0.9).requires_grad_(True)
    radius = (torch.rand(5, dtype=torch.float64) + 0.5).requires_grad_(True)
    labels = torch.tensor([0, 3, 1, 1, 2])

    def target(c):
        return arcface_target_logit(c, 0.4)

    loss = margin_cross_entropy(cos * radius[:, None], labels, target, radius)
    loss.backward()
    c2 = cos.detach().clone().requires_grad_(True)
    r2 = radius.detach().clone().requires_grad_(True)
    logits = c2 * r2[:, None]
    rows = torch.arange(5)
    changed = logits.index_put((rows, labels), r2 * target(c2[rows, labels]))
    expected = F.cross_entropy(changed, labels)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cos.grad, c2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(radius.grad, r2.grad, rtol=1e-10, atol=1e-12)


def test_margin_cross_entropy_refuses_a_second_backward():
    logits = torch.randn(3, 4, requires_grad=True)
    loss = margin_cross_entropy(logits * 2, torch.tensor([0, 1, 2]), _identity, 2.0)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward"):
        loss.backward()


@pytest.mark.parametrize("n,c,d", [(1, 3, 2), (6, 11, 5)])
def test_cosine_logits_match_f_normalize(n, c, d):
    g = torch.Generator().manual_seed(n + c + d)
    features = torch.randn(n, d, dtype=torch.float64, generator=g)
    lengths = torch.rand(c, 1, dtype=torch.float64, generator=g) * 4  # unequal ||W_j||
    weight = torch.randn(c, d, dtype=torch.float64, generator=g) * lengths
    upstream = torch.randn(n, c, dtype=torch.float64, generator=g)
    f1, w1 = features.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    f2, w2 = features.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    ours = cosine_logits(f1, w1)
    (ours * upstream).sum().backward()
    theirs = f2 @ F.normalize(w2, dim=1).T
    (theirs * upstream).sum().backward()
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(f1.grad, f2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "dtype,scale",
    [
        (torch.float64, 1.0),
        (torch.float64, 30.0),
        (torch.float64, 900.0),
        (torch.float32, 20.0),
        (torch.float32, 200.0),
    ],
)
@pytest.mark.parametrize("per_row_radius,radius_grad", [(False, False), (True, True), (False, True)])
def test_fused_cosine_margin_ce_matches_the_two_step_path(dtype, scale, per_row_radius, radius_grad):
    """Value and gradients (features, weight, radius) of the fused function equal cosine_logits +
    margin_cross_entropy, with unequal ||W_j||, a zero class weight, scales on both sides of the
    no-shift bound (60 in fp32, 600 in fp64), and a radius given per row or as one learnable number."""
    g = torch.Generator().manual_seed(int(scale) + per_row_radius)
    n, c, d = 7, 9, 5
    unit = F.normalize(torch.randn(n, d, dtype=torch.float64, generator=g), dim=1)
    radius = (
        (torch.rand(n, dtype=torch.float64, generator=g) + 0.5) * scale
        if per_row_radius
        else torch.tensor(scale, dtype=torch.float64)
    )
    weight = (
        torch.randn(c, d, dtype=torch.float64, generator=g) * torch.rand(c, 1, dtype=torch.float64, generator=g) * 3
    )
    weight[4] = 0  # a class weight of length 0: cosine 0, no radial gradient
    labels = torch.tensor([0, 8, 3, 3, 4, 1, 0])

    def target(cos):
        return arcface_target_logit(cos, 0.5)

    def inputs():
        r = radius.to(dtype).clone().requires_grad_(radius_grad)
        u = unit.to(dtype).clone().requires_grad_(True)
        w = weight.to(dtype).clone().requires_grad_(True)
        return u, r, w

    u1, r1, w1 = inputs()
    features = u1 * (r1[:, None] if per_row_radius else r1)
    ours = cosine_margin_cross_entropy(features, w1, labels, target, r1, float(radius.max()))
    ours.backward()
    u2, r2, w2 = inputs()
    logits = cosine_logits(u2 * (r2[:, None] if per_row_radius else r2), w2)
    theirs = margin_cross_entropy(logits, labels, target, r2)
    theirs.backward()
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    assert torch.isfinite(ours)
    torch.testing.assert_close(ours, theirs, **tol)
    torch.testing.assert_close(u1.grad, u2.grad, **tol)
    torch.testing.assert_close(w1.grad, w2.grad, **tol)
    if radius_grad:
        assert r1.grad.shape == r1.shape
        torch.testing.assert_close(r1.grad, r2.grad, **tol)


def test_fused_cosine_margin_ce_refuses_a_second_backward():
    features, weight = torch.randn(3, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    loss = cosine_margin_cross_entropy(features * 2, weight, torch.tensor([0, 1, 2]), _identity, 2.0, 2.0)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward"):
        loss.backward()


def test_cosine_margin_heads_give_inference_logits_without_margin():
    torch.manual_seed(2)
    x = torch.randn(4, 8, dtype=torch.float64)
    cosine_heads = (
        ArcFaceHead(8, 5),
        CosFaceHead(8, 5),
        NormSoftmaxHead(8, 5, temperature=0.1),
        CoCoHead(8, 5, alpha=3.0),
    )
    for head in cosine_heads:
        head = head.double()
        cos = F.normalize(x, dim=1) @ F.normalize(head.weight, dim=1).T
        torch.testing.assert_close(head.logits(x), head.scale * cos)
    sphere = SphereFaceHead(8, 5).double()
    cos = F.normalize(x, dim=1) @ F.normalize(sphere.weight, dim=1).T
    torch.testing.assert_close(sphere.logits(x), x.norm(dim=1, keepdim=True) * cos)
    lsoft = LSoftmaxHead(8, 5).double()
    torch.testing.assert_close(lsoft.logits(x), x @ lsoft.weight.T)


def test_loss_is_invariant_to_batch_order():
    head = ArcFaceHead(8, 6).double()
    x, y = torch.randn(7, 8, dtype=torch.float64), torch.randint(0, 6, (7,))
    perm = torch.randperm(7)
    torch.testing.assert_close(head(x, y), head(x[perm], y[perm]))
    assert math.isfinite(head(x, y).item())


@pytest.mark.parametrize("zero_row", [False, True])
def test_scaled_unit_rows_match_f_normalize_with_and_without_a_zero_row(zero_row):
    """The fused weight-norm kernels give F.normalize's value and gradient; a zero row (which
    they would divide by) takes the clamped way: zero out, gradient scale * g / eps."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 5, dtype=torch.float64, generator=g) * torch.rand(6, 1, dtype=torch.float64, generator=g) * 4
    if zero_row:
        x[2] = 0
    upstream = torch.randn(6, 5, dtype=torch.float64, generator=g)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours = _scaled_unit_rows(x1, 30.0)
    (ours * upstream).sum().backward()
    theirs = 30.0 * F.normalize(x2, dim=1)
    (theirs * upstream).sum().backward()
    assert torch.isfinite(x1.grad).all()
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "cls,kwargs", [*HEADS, (ProxyAnchorHead, {}), (ProxyNCAHead, {})], ids=[*IDS, "ProxyAnchorHead", "ProxyNCAHead"]
)
@pytest.mark.parametrize("zero_row", [False, True])
def test_public_fallback_of_the_fused_weight_norm_gives_the_same_values_and_gradients(
    monkeypatch, cls, kwargs, zero_row
):
    """Without aten's private weight-norm ops (``FUSED_WEIGHT_NORM`` off, as where a torch lacks
    them) every head gives the same loss, logits and gradients, for a CLS-token slice too (the
    kernel reads storage whatever the strides) and with a zero embedding and a zero class weight."""
    g = torch.Generator().manual_seed(4)
    tokens = torch.randn(7, 2, 8, dtype=torch.float64, generator=g)
    if zero_row:
        tokens[3] = 0
    labels = torch.tensor([0, 1, 2, 3, 4, 5, 0])
    results = []
    for fused in (True, False):
        monkeypatch.setattr(margin_softmax, "FUSED_WEIGHT_NORM", fused)
        torch.manual_seed(0)
        head = cls(8, 6, **kwargs).double()
        if zero_row:
            with torch.no_grad():
                next(head.parameters())[5] = 0  # class weights or proxies
        source = tokens.clone().requires_grad_(True)
        x = source[:, 0]  # not contiguous
        loss = head(x, labels)
        loss.backward()
        grads = [p.grad for p in head.parameters() if p.grad is not None]
        results.append((loss.detach(), head.logits(x).detach(), source.grad, grads))
    (v0, l0, g0, p0), (v1, l1, g1, p1) = results
    torch.testing.assert_close(v1, v0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(l1, l0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g1, g0, rtol=1e-10, atol=1e-12)
    assert len(p1) == len(p0) > 0
    for a, b in zip(p1, p0):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _naive_arcface(x, weight, labels, scale=64.0, margin=0.5):
    cos = F.normalize(x, dim=1) @ F.normalize(weight, dim=1).T
    target = torch.cos(torch.acos(cos.gather(1, labels[:, None]).clamp(-1, 1)) + margin)
    logits = cos.scatter(1, labels[:, None], target) * scale
    return F.cross_entropy(logits, labels)


def _value_and_grads(loss_fn, x, head):
    x = x.clone().requires_grad_(True)
    head.zero_grad(set_to_none=True)
    loss = loss_fn(x)
    loss.backward()
    return loss.detach(), x.grad, head.weight.grad


@pytest.mark.parametrize("scale,largest_norm", [(64.0, 1.0), (30.0, 1e15), (64.0, 1e15)])
def test_fp32_head_with_weight_norms_far_apart_matches_fp64(scale, largest_norm):
    """The fused loss folds 1/||W_j|| into its exp while the exponents ``s cos - log ||W_j||``
    stay in fp32's range and scales by column otherwise (s = 64 with a norm of 1e15 leaves
    it); either way the fp32 value and gradients equal the fp64 formula. A zero class weight
    (clamped to eps, log eps = -27.6) and norms from 1e-3 up are in every case."""
    g = torch.Generator().manual_seed(7)
    n, c, d = 24, 12, 16
    x = torch.randn(n, d, dtype=torch.float64, generator=g)
    weight = F.normalize(torch.randn(c, d, dtype=torch.float64, generator=g), dim=1)
    weight *= torch.logspace(-3, math.log10(largest_norm), c, dtype=torch.float64)[:, None]
    weight[5] = 0
    labels = torch.randint(0, c, (n,), generator=g)
    head = ArcFaceHead(d, c, scale=scale).double()
    with torch.no_grad():
        head.weight.copy_(weight)
    expected = [
        t.clone() for t in _value_and_grads(lambda v: _naive_arcface(v, head.weight, labels, scale=scale), x, head)
    ]
    head = head.float()
    value, grad_x, grad_w = _value_and_grads(lambda v: head(v, labels), x.float(), head)
    assert torch.isfinite(value) and torch.isfinite(grad_x).all() and torch.isfinite(grad_w).all()
    torch.testing.assert_close(value.double(), expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_x.double(), expected[1], rtol=1e-4, atol=1e-6)
    # Relative to each row's size: ||dL/dW_j|| scales as 1/||W_j||, 1e3 down to 1e-15.
    row_scale = expected[2].norm(dim=1, keepdim=True).clamp_min(1e-30)
    torch.testing.assert_close(grad_w.double() / row_scale, expected[2] / row_scale, rtol=1e-4, atol=1e-4)


def test_head_reuses_its_workspace_and_stays_exact_when_calls_overlap():
    """The fused loss's scratch buffers come back to the head's workspace after backward and are
    reused; two losses alive at once (one backward for both), a forward whose graph is dropped,
    and a forward under no_grad all leave every gradient equal to the naive formula's."""
    g = torch.Generator().manual_seed(4)
    head = ArcFaceHead(16, 40).double()
    x1, x2 = (torch.randn(8, 16, dtype=torch.float64, generator=g) for _ in range(2))
    y1, y2 = (torch.randint(0, 40, (8,), generator=g) for _ in range(2))

    def naive(x, y):
        return _value_and_grads(lambda v: _naive_arcface(v, head.weight, y), x, head)

    def expect_naive(x, y):
        torch.testing.assert_close(_value_and_grads(lambda v: head(v, y), x, head), naive(x, y), rtol=1e-9, atol=1e-12)

    expect_naive(x1, y1)
    kept = dict(head.workspace._free)
    assert set(kept) == {"logits", "weight_grad"}
    expect_naive(x2, y2)  # the same two buffers again
    assert all(head.workspace._free[k] is kept[k] for k in kept)

    # Two forwards before one backward: the second must not write into the first's buffer.
    a, b = x1.clone().requires_grad_(True), x2.clone().requires_grad_(True)
    head.zero_grad(set_to_none=True)
    (head(a, y1) + head(b, y2)).backward()
    a_ref, b_ref = x1.clone().requires_grad_(True), x2.clone().requires_grad_(True)
    weight_grad = head.weight.grad.clone()
    head.zero_grad(set_to_none=True)
    (_naive_arcface(a_ref, head.weight, y1) + _naive_arcface(b_ref, head.weight, y2)).backward()
    torch.testing.assert_close(
        (a.grad, b.grad, weight_grad), (a_ref.grad, b_ref.grad, head.weight.grad), rtol=1e-9, atol=1e-12
    )

    head(x1.clone().requires_grad_(True), y1)  # graph dropped, never differentiated
    with torch.no_grad():
        head(x2, y2)
    expect_naive(x2, y2)


def test_workspace_keeps_buffers_only_on_the_cpu_and_not_in_copies():
    import copy
    import pickle

    ws = Workspace()
    a = ws.take("x", (3, 2), torch.float32, torch.device("cpu"))
    ws.give_back("x", a)
    assert ws.take("x", (3, 2), torch.float32, torch.device("cpu")) is a
    ws.give_back("x", a)
    assert ws.take("x", (2, 3), torch.float32, torch.device("cpu")) is not a  # another shape: a new buffer
    ws.give_back("x", torch.empty(1, device="meta"))
    assert "x" not in ws._free  # accelerators have caching allocators of their own
    head = ArcFaceHead(4, 3)
    head(torch.randn(2, 4), torch.tensor([0, 2])).backward()
    assert head.workspace._free
    assert not copy.deepcopy(head).workspace._free
    assert not pickle.loads(pickle.dumps(head)).workspace._free


@pytest.mark.parametrize("cls", [ArcFaceHead, ProxyAnchorHead, ProxyNCAHead])
def test_a_frozen_head_under_inference_mode_leaves_nothing_that_training_cannot_write(cls):
    """Evaluating a frozen head under inference_mode makes its buffers inference tensors, which
    no op may write outside that mode: the workspace must not keep them for the training step."""
    head = cls(8, 5).requires_grad_(False)
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
    with torch.inference_mode():
        head(x, y)
    head.requires_grad_(True)
    head(x.clone().requires_grad_(True), y).backward()
    assert all(not b.is_inference() for b in head.workspace._free.values())
