"""The shared loss helpers: the symmetric one-matmul backward product, in and across row blocks;
and the input checks every labelled loss of the registry shares."""

import pytest
import torch

from loss_utils import value_and_grads
from sslkit.losses import KIND, _common, build
from sslkit.losses.dcl import dcl_loss
from sslkit.losses.ntxent import ntxent_loss
from sslkit.losses.supcon import supcon_loss


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


@pytest.mark.parametrize("name", sorted(n for n, kind in KIND.items() if kind != "two_view"))
def test_every_labelled_loss_says_labels_are_required(name):
    """``loss(embeddings, None)``, for every pair loss and head in the registry: one ValueError
    saying what is missing, not an AttributeError from deep inside."""
    loss = build(name, embedding_dim=8, num_classes=5) if KIND[name] == "head" else build(name)
    with pytest.raises(ValueError, match="labels are required"):
        loss(torch.randn(4, 8), None)
