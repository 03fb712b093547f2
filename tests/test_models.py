"""Backbones stay torchvision-compatible; widths and stems give the documented shapes."""

import pytest
import torch
import torchvision

from sslkit.models import build_backbone, build_mlp, count_parameters


def test_full_width_resnet18_loads_into_torchvision():
    ours = build_backbone("resnet18", width=64, cifar_stem=False)
    theirs = torchvision.models.resnet18()
    theirs.fc = torch.nn.Identity()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 64, 64)
    ours.eval(), theirs.eval()
    torch.testing.assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("name,width,dim", [("resnet18", 16, 128), ("resnet34", 8, 64), ("resnet50", 16, 512)])
def test_feature_dim_and_grayscale_cifar_stem(name, width, dim):
    model = build_backbone(name, width=width, cifar_stem=True, in_channels=1)
    assert model.feature_dim == dim
    assert model(torch.randn(3, 1, 16, 16)).shape == (3, dim)


def test_narrow_resnet_is_cpu_sized():
    assert count_parameters(build_backbone("resnet18", width=16, cifar_stem=True)) < 1_000_000


def test_mlp_shapes_and_last_batch_norm():
    mlp = build_mlp(32, 64, 16, num_layers=3, last_batch_norm=True)
    assert mlp(torch.randn(4, 32)).shape == (4, 16)
    assert isinstance(mlp[-1], torch.nn.BatchNorm1d) and not mlp[-1].affine


def test_bad_names():
    with pytest.raises(ValueError, match="backbone"):
        build_backbone("vgg11")
