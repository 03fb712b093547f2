"""The shared loss helpers: the symmetric one-matmul backward product, in and across row blocks;
and the input checks every labelled loss of the registry shares."""

import pytest
import torch
from dist_utils import run_in_processes
from loss_utils import value_and_grads

from sslkit.losses import KIND, _common, build, loss_arguments
from sslkit.losses.dcl import dcl_loss
from sslkit.losses.ntxent import ntxent_loss
from sslkit.losses.proxy_anchor import proxy_anchor_loss
from sslkit.losses.proxy_nca import proxy_nca_loss
from sslkit.losses.supcon import supcon_loss

# Called with labels: pair losses and heads. The others take two (N, D) embeddings: two views,
# queries and keys (whose rows must hold both views: N even), or a student's and a teacher's views.
LABELLED = sorted(n for n, kind in KIND.items() if kind in ("label", "head"))
# The losses that gather across processes say so with a gather_distributed switch.
GATHERING = sorted(n for n in KIND if "gather_distributed" in loss_arguments(n))


@pytest.mark.parametrize("n", [1, 5, 512, 513, 1100])  # one row, inside one block, on and across block edges
def test_symmetric_pair_product_matches_two_products(n):
    g = torch.Generator().manual_seed(n)
    half = torch.rand(n, n, generator=g, dtype=torch.float64)
    exp = half + half.T  # symmetric
    scale = torch.rand(n, 1, generator=g, dtype=torch.float64)
    rows = torch.randn(n, 7, generator=g, dtype=torch.float64)
    expected = scale * (exp @ rows) + exp.T @ (scale * rows)
    torch.testing.assert_close(_common.symmetric_pair_product(exp, scale, rows), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "loss",
    [
        lambda x, labels: ntxent_loss(*x.chunk(2), temperature=0.2),
        lambda x, labels: dcl_loss(*x.chunk(2), temperature=0.2),
        lambda x, labels: supcon_loss(x, labels, temperature=0.1),
    ],
    ids=["ntxent", "dcl", "supcon"],
)
def test_losses_give_the_same_gradient_in_row_blocks(monkeypatch, loss):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(14, 6, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 4, (14,), generator=g)
    whole = value_and_grads(loss, x, labels)
    monkeypatch.setattr(_common, "PAIR_PRODUCT_ROWS", 3)  # 5 blocks, the last one short
    blocked = value_and_grads(loss, x, labels)
    for a, b in zip(blocked, whole):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", LABELLED)
def test_every_labelled_loss_says_labels_are_required(name):
    """``loss(embeddings, None)``, for every pair loss and head in the registry: one ValueError
    saying what is missing, not an AttributeError from deep inside."""
    loss = build(name, embedding_dim=8, num_classes=5) if KIND[name] == "head" else build(name)
    with pytest.raises(ValueError, match="labels are required"):
        loss(torch.randn(4, 8), None)


def _build(name, dim=8):
    """Loss ``name`` for (N, ``dim``) embeddings: a head gets its sizes, DINO its centre's size."""
    if KIND[name] == "head":
        return build(name, embedding_dim=dim, num_classes=5)
    return build(name, output_dim=dim) if KIND[name] == "student_teacher" else build(name)


def _call(name, loss, first, second):
    """``loss(first, second)``; DINO's call also takes the epoch of its teacher-temperature schedule."""
    return loss(first, second, epoch=0) if KIND[name] == "student_teacher" else loss(first, second)


@pytest.mark.parametrize("name", sorted(KIND))
def test_every_loss_names_an_input_that_is_not_a_tensor(name):
    """None for the second view, a Python list of labels, a NumPy array of embeddings: a
    ValueError naming the argument, not an AttributeError from inside the loss."""
    loss, x = _build(name), torch.randn(4, 8)
    if KIND[name] in ("two_view", "batch_statistics"):
        calls = [((x, None), "z2"), ((x.numpy(), x), "z1"), ((x, x), None)]
        if KIND[name] == "two_view":
            with pytest.raises(ValueError, match="negatives"):
                loss(x, x, negatives=[[0.0] * 8])
    elif KIND[name] == "query_key":
        calls = [((x, None), "keys"), ((x.numpy(), x), "queries"), ((x, x), None)]
    elif KIND[name] == "student_teacher":
        calls = [((x, None), "teacher"), ((x.numpy(), x[:2]), "student"), ((x, x[:2]), None)]
    else:
        labels = torch.tensor([0, 1, 0, 1])
        calls = [((x, [0, 1, 0, 1]), "labels"), ((x.numpy(), labels), "embeddings"), ((x, labels), None)]
    for args, argument in calls:
        if argument is None:
            assert torch.isfinite(_call(name, loss, *args))  # the same call with tensors works
        else:
            with pytest.raises(ValueError, match=f"{argument} must be a torch.Tensor"):
                _call(name, loss, *args)


@pytest.mark.parametrize("name", LABELLED)
def test_an_empty_batch_is_zero_for_pair_losses_and_an_error_for_heads(name):
    """Pair losses have no pair to average in an empty batch and return 0 (backward works);
    a head's mean over no samples is undefined: one ValueError. (aten's fused row
    normalisation dies with SIGFPE on zero rows, so this also guards the process.) A head's
    logits for no samples are (0, C)."""
    loss, x, labels = _build(name), torch.randn(0, 8, requires_grad=True), torch.zeros(0, dtype=torch.long)
    if KIND[name] == "head":
        with pytest.raises(ValueError, match="at least one sample"):
            loss(x, labels)
        assert loss.logits(torch.randn(0, 8)).shape == (0, 5)
    else:
        value = loss(x, labels)
        value.backward()
        assert value.item() == 0.0 and x.grad.shape == (0, 8)


@pytest.mark.parametrize("name", LABELLED)
@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.int16])
def test_every_labelled_loss_takes_any_integer_label_dtype(name, dtype):
    """Labels in int32, uint8 or int16 give the int64 loss (uint8 once indexed as a mask, and
    gather and cross_entropy refused int32/uint8 inside the heads)."""
    g = torch.Generator().manual_seed(0)
    x, labels = torch.randn(12, 8, generator=g, dtype=torch.float64), torch.arange(12) % 4
    loss = _build(name).double().eval()  # eval: AdaCos's dynamic scale does not move between the calls
    expected = loss(x, labels)
    torch.testing.assert_close(loss(x, labels.to(dtype)), expected)


@pytest.mark.parametrize("name", sorted(n for n, kind in KIND.items() if kind == "two_view"))
def test_two_view_losses_refuse_an_integer_bank_as_they_refuse_integer_views(name):
    z = torch.randn(4, 8)
    with pytest.raises(ValueError, match="negatives must be floating point embeddings, got torch.int64"):
        _build(name)(z, z, negatives=torch.ones(5, 8, dtype=torch.long))


@pytest.mark.parametrize("name", sorted(n for n, kind in KIND.items() if kind not in ("label", "head")))
def test_two_view_losses_take_views_of_different_float_dtypes(name):
    """A float64 view with a float32 one meets in float64 (the NCE loss once failed in its matmul)."""
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(6, 8, generator=g, dtype=torch.float64), torch.randn(6, 8, generator=g, dtype=torch.float64)
    first, second = _build(name), _build(name)  # one each: DINO's centre moves with every call
    torch.testing.assert_close(_call(name, first, z1, z2.float()), _call(name, second, z1, z2.float().double()))


@pytest.mark.parametrize("name", sorted(KIND))
@pytest.mark.parametrize("value", [None, "abc", [1.0], float("nan"), float("inf"), -1.0])
def test_every_numeric_argument_that_is_not_a_valid_number_is_named(name, value):
    """Each number a loss takes (temperature, margin, scale, ...), given None, a word, a list,
    NaN, inf or -1 (outside every one's range): a ValueError naming the argument
    (``float()``'s own TypeError did not say which), and the loss is not built."""
    from sslkit.losses import loss_arguments

    sizes = {"embedding_dim": 8, "num_classes": 5} if KIND[name] == "head" else {}
    for argument, parameter in loss_arguments(name).items():
        default = parameter.default
        if argument == "num_classes" or isinstance(default, bool) or not isinstance(default, (int, float)):
            continue  # sizes, switches and optional (None) settings are checked elsewhere
        with pytest.raises(ValueError, match=argument):
            build(name, **sizes, **{argument: value})


def _public_loss_functions():
    """Every public ``*_loss`` function of the loss modules, with its parameters."""
    import importlib
    import inspect
    import pkgutil

    import sslkit.losses

    for info in pkgutil.iter_modules(sslkit.losses.__path__):
        module = importlib.import_module(f"sslkit.losses.{info.name}")
        for name, fn in vars(module).items():
            if (
                name.endswith("_loss")
                and not name.startswith("_")
                and inspect.isfunction(fn)
                and fn.__module__ == module.__name__
            ):
                yield name, fn, inspect.signature(fn).parameters.values()


def _functional_losses():
    """Every public ``*_loss`` function of the loss modules, with the numbers it takes."""
    return [
        pytest.param(fn, p.name, id=f"{name}-{p.name}")
        for name, fn, parameters in _public_loss_functions()
        for p in parameters
        if isinstance(p.default, float) and not isinstance(p.default, bool)
    ]


def _functional_inputs(fn):
    """Valid positional inputs for a functional loss: two views (or a list of them), a labelled batch, one
    with proxies, or queries and keys with a bank."""
    import inspect

    x, labels = torch.randn(6, 8), torch.tensor([0, 0, 1, 1, 2, 2])
    first = list(inspect.signature(fn).parameters)[:3]
    if first[0] == "views":
        return ([x, x + 0.1, x - 0.1],)
    if "proxies" in first:
        return x, labels, torch.randn(3, 8)
    if "negatives" in first:  # MoCo's multi-crop InfoNCE: queries, keys and a bank
        return x, x + 0.1, torch.randn(4, 8)
    if "labels" in first:
        return x, labels
    return x, x + 0.1


@pytest.mark.parametrize("fn,argument", _functional_losses())
@pytest.mark.parametrize("value", [-1.0, float("nan"), None])
def test_every_functional_loss_checks_its_numbers(fn, argument, value):
    """The functional forms (``ntxent_loss``, ``triplet_loss``, ``proxy_nca_loss``, ...) check
    their numbers as the classes do: a ValueError naming the argument, not a NaN loss, a
    ZeroDivisionError or a silently negative temperature."""
    with pytest.raises(ValueError, match=argument):
        fn(*_functional_inputs(fn), **{argument: value})


def _switches():
    """(registry name, argument) for every True/False argument a loss's constructor takes."""
    from sslkit.losses import loss_arguments

    return [
        pytest.param(name, argument, id=f"{name}-{argument}")
        for name in sorted(KIND)
        for argument, parameter in loss_arguments(name).items()
        if isinstance(parameter.default, bool)
    ]


@pytest.mark.parametrize("name,argument", _switches())
def test_every_switch_refuses_a_word_and_takes_true_and_false(name, argument):
    """``build("arcface", ..., easy_margin="no")`` turned the margin on: a non-empty string is
    truthy. Now each switch (normalize, gather_distributed, easy_margin, ...) refuses it with a
    ValueError naming the argument, and True and False both build and are kept as given."""
    sizes = {"embedding_dim": 16, "num_classes": 5} if KIND[name] == "head" else {}
    with pytest.raises(ValueError, match=f"^{argument} must be True or False, got 'no'$"):
        build(name, **sizes, **{argument: "no"})
    for value in (True, False):
        assert f"{argument}={value}" in repr(build(name, **sizes, **{argument: value}))


def _functional_switches():
    return [
        pytest.param(fn, p.name, id=f"{name}-{p.name}")
        for name, fn, parameters in _public_loss_functions()
        for p in parameters
        if isinstance(p.default, bool)
    ]


@pytest.mark.parametrize("fn,argument", _functional_switches())
def test_every_functional_loss_checks_its_switches(fn, argument):
    """``triplet_loss(..., normalize="false")``, ``ntxent_loss(..., gather_distributed="false")``:
    the same ValueError as the classes give, and False itself is a loss."""
    with pytest.raises(ValueError, match=f"^{argument} must be True or False, got 'false'$"):
        fn(*_functional_inputs(fn), **{argument: "false"})
    assert torch.isfinite(fn(*_functional_inputs(fn), **{argument: False}))


def test_public_helpers_with_a_switch_check_it():
    from sslkit.losses.arcface import arcface_target_logit
    from sslkit.losses.dclw import vmf_weights
    from sslkit.losses.margin_softmax import cosine_logits, cosine_margin_cross_entropy

    x, w, labels = torch.randn(4, 8), torch.randn(3, 8), torch.tensor([0, 1, 2, 0])
    calls = {
        "easy_margin": lambda v: arcface_target_logit(torch.rand(4), 0.5, easy_margin=v),
        "gather_distributed": lambda v: vmf_weights(x, x + 0.1, gather_distributed=v),
        "private_grad": lambda v: cosine_logits(x, w, private_grad=v),
        "target_in_denominator": lambda v: cosine_margin_cross_entropy(
            x, w, labels, lambda c: c, 1.0, 10.0, target_in_denominator=v
        ),
    }
    for argument, call in calls.items():
        with pytest.raises(ValueError, match=f"^{argument} must be True or False, got 'no'$"):
            call("no")
        assert torch.isfinite(call(False)).all()


def test_check_flag_takes_true_false_and_their_unambiguous_spellings_only():
    import numpy as np

    for value, expected in [
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        (np.bool_(True), True),
        (np.array(False), False),
        (torch.tensor(True), True),
        (torch.tensor(False), False),
    ]:
        assert _common.check_flag(value, "x") is expected
    for value in [
        "no",
        "false",
        "True",
        "",
        None,
        0.0,
        1.0,
        2,
        -1,
        [True],
        np.int64(1),
        torch.tensor([True]),
        torch.tensor(1),
    ]:
        with pytest.raises(ValueError, match="^x must be True or False, got "):
            _common.check_flag(value, "x")


@pytest.mark.parametrize("fn", [proxy_nca_loss, proxy_anchor_loss])
def test_functional_proxy_losses_check_the_proxies_and_labels(fn):
    x, labels = torch.randn(4, 8), torch.tensor([0, 1, 2, 1])
    with pytest.raises(ValueError, match=r"proxies must be \(C, 8\)"):
        fn(x, labels, torch.randn(3, 7))
    with pytest.raises(ValueError, match="labels must be in"):
        fn(x, torch.tensor([0, 1, 3, 1]), torch.randn(3, 8))
    with pytest.raises(ValueError, match="labels are required"):
        fn(x, None, torch.randn(3, 8))
    with pytest.raises(ValueError, match="at least one sample"):
        fn(torch.randn(0, 8), torch.zeros(0, dtype=torch.long), torch.randn(3, 8))


def test_functional_proxy_nca_needs_a_second_proxy_as_its_head_does():
    """One proxy leaves Proxy-NCA's denominator empty: the function said NaN where the head refuses."""
    x, labels = torch.randn(6, 8), torch.zeros(6, dtype=torch.long)
    with pytest.raises(ValueError, match="proxies must have at least 2 rows"):
        proxy_nca_loss(x, labels, torch.randn(1, 8))
    assert proxy_nca_loss(x, labels, torch.randn(1, 8), include_positive_in_denominator=True) == 0


_EXTREME_BATCHES = {
    "tiny (1e-30)": lambda x: x * 1e-30,
    "identical rows": lambda x: x[:1].repeat(len(x), 1),
    "all zero": torch.zeros_like,
    "one zero row": lambda x: torch.cat([torch.zeros_like(x[:1]), x[1:]]),
    "fp16 of size 300": lambda x: (x * 300).half(),
    "bf16": lambda x: x.bfloat16(),
}


# VICReg's covariance term grows as the 4th power of the embeddings' scale: at 300 its exact gradient
# is about 6e6, past fp16's largest number (65504), so no implementation can return it in fp16.
_BEYOND_HALF_PRECISION = {("vicreg", "fp16 of size 300")}


@pytest.mark.parametrize("case", sorted(_EXTREME_BATCHES))
@pytest.mark.parametrize("name", sorted(KIND))
def test_every_loss_stays_finite_on_extreme_but_valid_batches(name, case):
    """No inf or NaN in the value or any gradient for degenerate batches a training run can
    produce: collapsed (identical) embeddings, zero or vanishing ones, large fp16 ones."""
    g = torch.Generator().manual_seed(0)
    x = _EXTREME_BATCHES[case](torch.randn(8, 16, generator=g))
    if (name, case) in _BEYOND_HALF_PRECISION:
        x = x.float()  # the same numbers, with a gradient that has room
    x.requires_grad_(True)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    loss = _build(name, 16)
    if name not in LABELLED:
        z2 = (x.detach().float() * 1.01).to(x.dtype).requires_grad_(True)
        value, leaves = _call(name, loss, x, z2), [x, z2]
    else:
        value, leaves = loss(x, labels), [x]
    value.backward()
    grads = [t.grad for t in leaves if t.grad is not None] + [p.grad for p in loss.parameters() if p.grad is not None]
    assert x.grad is not None
    assert torch.isfinite(value), value
    assert all(torch.isfinite(grad).all() for grad in grads)


_STRIDED = {
    "a token slice x[:, 0]": lambda x: torch.stack([x, -x], dim=1)[:, 0],
    "every other column": lambda x: torch.stack([x, -x], dim=2).flatten(1)[:, ::2],
    "a transpose": lambda x: x.T.contiguous().T,
}


@pytest.mark.parametrize("layout", sorted(_STRIDED))
@pytest.mark.parametrize("name", sorted(KIND))
def test_every_loss_gives_the_same_value_and_gradients_for_non_contiguous_embeddings(name, layout):
    """A CLS-token slice or a column split is not contiguous in memory: same loss, logits and
    gradients as its contiguous copy (aten's weight-norm kernel once read such a slice's storage)."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(8, 16, dtype=torch.float64, generator=g)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    results = []
    for make in (lambda x: x.clone(), _STRIDED[layout]):
        torch.manual_seed(0)  # a new loss each time: AdaCos's dynamic scale changes with every call
        loss = _build(name, 16)
        loss = loss.double() if isinstance(loss, torch.nn.Module) else loss
        source = base.clone().requires_grad_(True)
        x = make(source)
        assert make is not _STRIDED[layout] or not x.is_contiguous()
        if name not in LABELLED:
            value = _call(name, loss, x, make(source * 0.9 + 0.1))
        else:
            value = loss(x, labels)
        value.backward()
        logits = loss.logits(x).detach() if KIND[name] == "head" else None
        params = (
            [p.grad.clone() for p in loss.parameters() if p.grad is not None] if hasattr(loss, "parameters") else []
        )
        results.append((value.detach(), source.grad, logits, params))
    (v0, g0, l0, p0), (v1, g1, l1, p1) = results
    torch.testing.assert_close(v1, v0)
    torch.testing.assert_close(g1, g0)
    if l0 is not None:
        torch.testing.assert_close(l1, l0)
    for a, b in zip(p1, p0):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", sorted(KIND))
def test_build_names_an_unknown_argument_and_lists_the_valid_ones(name):
    """``build("ntxent", temp=0.1)``: one ValueError naming ``temp`` and the loss's arguments
    with their defaults, not Python's TypeError about an unexpected keyword."""
    from sslkit.losses import loss_arguments

    sizes = {"embedding_dim": 8, "num_classes": 5} if KIND[name] == "head" else {}
    with pytest.raises(ValueError, match=f"loss '{name}' takes no argument 'temp'; its arguments are: ") as error:
        build(name, temp=0.1, **sizes)
    listed = str(error.value).split("its arguments are: ")[1]
    for argument, parameter in loss_arguments(name, with_trainer_supplied=True).items():
        shown = argument if parameter.default is parameter.empty else f"{argument}={parameter.default!r}"
        assert shown in listed.split(", ")


@pytest.mark.parametrize("name", sorted(n for n, kind in KIND.items() if kind == "head"))
def test_build_names_the_missing_sizes_of_a_head(name):
    with pytest.raises(ValueError, match=f"loss '{name}' needs embedding_dim and num_classes \\(the embedding size D"):
        build(name)
    with pytest.raises(ValueError, match=f"loss '{name}' needs num_classes \\(the number of classes C\\)$"):
        build(name, embedding_dim=8)


def test_build_leaves_a_type_error_inside_a_constructor_alone(monkeypatch):
    """Only a wrong argument list becomes the ValueError: a bug inside ``__init__`` keeps its TypeError."""
    from sslkit.losses.ntxent import NTXentLoss

    def broken(self, temperature=0.5, gather_distributed=True):
        raise TypeError("a bug")

    monkeypatch.setattr(NTXentLoss, "__init__", broken)
    with pytest.raises(TypeError, match="a bug"):
        build("ntxent", temperature=0.2)


@pytest.mark.parametrize("name", LABELLED)
def test_every_labelled_loss_called_without_labels_says_they_are_required(name):
    """``loss(embeddings)`` with no labels argument at all: the same ValueError as labels=None,
    not a TypeError about a missing positional argument; a head's ``logits(embeddings)`` needs none."""
    loss, x = _build(name), torch.randn(4, 8)
    with pytest.raises(ValueError, match="labels are required"):
        loss(x)
    if KIND[name] == "head":
        assert loss.logits(x).shape == (4, 5)


@pytest.mark.parametrize("name", LABELLED)
def test_embeddings_of_the_wrong_rank_or_dtype_get_their_own_message(name):
    loss, labels = _build(name), torch.tensor([0, 1, 0, 1])
    with pytest.raises(
        ValueError, match=r"^embeddings must be 2-D \(N, D\), got shape \(4, 8, 1\); for \(batch, views, D\)"
    ):
        loss(torch.randn(4, 8, 1), labels)
    with pytest.raises(ValueError, match=r"^embeddings must be 2-D \(N, D\), got shape \(32,\)$"):
        loss(torch.randn(32), labels)
    with pytest.raises(ValueError, match=r"^embeddings must be floating point, got torch.int64$"):
        loss(torch.ones(4, 8, dtype=torch.long), labels)
    if KIND[name] == "head":
        with pytest.raises(ValueError, match=r"^embeddings must be 2-D \(N, D\), got shape \(4, 8, 1\)$"):
            loss.logits(torch.randn(4, 8, 1))


def test_supcon_on_batch_views_dim_embeddings_gives_the_reshape_hint_and_the_hint_is_right():
    """SupContrast's (batch, views, D) layout: the error says how to flatten it, and following it
    gives SupContrast's own loss (its rows are the views stacked: ``cat(unbind(features, 1))``
    with ``labels.repeat(views)``). Pairing the reshape with ``labels.repeat`` would not."""
    g = torch.Generator().manual_seed(0)
    batch, views, dim = 8, 2, 16
    features = torch.randn(batch, views, dim, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    loss = build("supcon")
    with pytest.raises(
        ValueError,
        match=r"embeddings must be 2-D \(N, D\), got shape \(8, 2, 16\); for \(batch, views, D\) "
        r"as in SupContrast, pass embeddings.reshape\(-1, D\) with labels.repeat_interleave\(views\)$",
    ):
        loss(features, labels)
    supcontrast = loss(torch.cat(features.unbind(1)), labels.repeat(views))
    torch.testing.assert_close(loss(features.reshape(-1, dim), labels.repeat_interleave(views)), supcontrast)
    assert not torch.allclose(loss(features.reshape(-1, dim), labels.repeat(views)), supcontrast)


def _uneven_batches(rank: int, world: int) -> dict:
    """Every gathering loss of the registry with 4 samples on rank 0 and 3 on rank 1, then 4 and 4."""
    messages = {}
    for name in GATHERING:
        loss = build(name)
        results = []
        for n in (4 - rank, 4):  # uneven first: after the error the process group must still work
            # Queries and keys stack both views: each view has n rows, as each view of a two-view loss.
            n = 2 * n if KIND[name] == "query_key" else n
            x = torch.randn(n, 8, requires_grad=True)
            try:
                value = loss(x, torch.randn(n, 8)) if name not in LABELLED else loss(x, torch.arange(n) % 2)
                value.backward()
                results.append("ok")
            except ValueError as error:
                results.append(str(error))
        messages[name] = results
    return messages


@pytest.mark.slow
def test_uneven_batches_across_two_processes_are_one_error_on_both_not_an_abort():
    """A last partial batch on one process (no drop_last) made gloo abort the process inside the
    gather; now every gathering loss raises the same ValueError on both, and the next even batch trains."""
    by_rank = run_in_processes(_uneven_batches)
    assert by_rank[0] == by_rank[1]
    for name, (uneven, even) in by_rank[0].items():
        assert uneven.startswith("batch sizes differ across processes (4, 3)") and "drop_last=True" in uneven, (
            name,
            uneven,
        )
        assert even == "ok", (name, even)
