"""Global BatchNorm on the CPU: two real processes (gloo) give what one process gives on the whole batch.

Values, input gradients, parameter gradients and running statistics, in float64, against plain
``nn.BatchNorm`` on the concatenated batch; plus one process, eval mode, conversion, and the
recipe-level option.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_in_processes
from torch import nn

from sslkit.config import config_from_dict
from sslkit.errors import UserError
from sslkit.methods import build_method
from sslkit.models import build_backbone
from sslkit.models.sync_batchnorm import GlobalBatchNorm, convert_sync_batchnorm

BATCH = 8  # global; each of two processes gets 4


def small_net() -> nn.Module:
    """Conv -> BatchNorm2d -> Linear -> BatchNorm1d (affine and not), float64, fixed weights."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 5, 3),
        nn.BatchNorm2d(5),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(5 * 4 * 4, 6),
        nn.BatchNorm1d(6),
        nn.ReLU(),
        nn.Linear(6, 4),
        nn.BatchNorm1d(4, affine=False),
    )
    with torch.no_grad():  # non-trivial affine parameters and running statistics
        for bn in (net[1], net[5]):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
            bn.running_mean.uniform_(-1, 1)
    return net.double()


def batch(offset: float = 30.0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(BATCH, 3, 6, 6, generator=generator, dtype=torch.float64) + offset
    targets = torch.randn(BATCH, 4, generator=generator, dtype=torch.float64)
    return images, targets


def local_loss(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A mean over the local rows: the mean of the two processes' losses is the 1-process loss."""
    return (out - targets).square().sum(dim=1).mean()


def _train_and_record(net: nn.Module, rows: slice, train_steps: int) -> dict:
    """``train_steps`` forwards on ``rows`` of the batch (the last with a backward), then eval mode on all of it."""
    images, targets = batch()
    for _ in range(train_steps - 1):  # earlier steps move the running statistics
        net(images[rows])
    x = images[rows].clone().requires_grad_(True)
    out = net(x)
    local_loss(out, targets[rows]).backward()
    net.eval()
    return {
        "out": out.detach(),
        "grad": x.grad,
        "params": {n: p.grad for n, p in net.named_parameters()},
        "buffers": {n: b.clone() for n, b in net.named_buffers()},
        "eval_out": net(images).detach(),
    }


def _steps(rank: int, world: int, train_steps: int) -> dict:
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    return _train_and_record(convert_sync_batchnorm(small_net(), "cpu"), rows, train_steps)


def _float32_far_from_zero(rank: int, world: int) -> torch.Tensor:
    """Outputs in float32 for inputs about 1000 from zero: E[x^2] - E[x]^2 would lose the variance there."""
    net = convert_sync_batchnorm(small_net().float(), "cpu")
    images, _ = batch(offset=1000.0)
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    return net(images[rows].float()).detach()


def _both(rank: int, world: int) -> dict:
    return {"steps": _steps(rank, world, 2), "float32": _float32_far_from_zero(rank, world)}  # one pair of processes


def one_process(train_steps: int) -> dict:
    """The reference: torch's own BatchNorm, one process, the whole batch."""
    return _train_and_record(small_net(), slice(None), train_steps)


@pytest.fixture(scope="module")
def two_processes() -> list[dict]:
    return run_in_processes(_both)


@pytest.mark.slow
def test_two_processes_equal_one_process_on_the_whole_batch(two_processes):
    results = [r["steps"] for r in two_processes]
    full = one_process(2)
    torch.testing.assert_close(torch.cat([r["out"] for r in results]), full["out"])
    # Convention of sslkit.distributed: a process's input gradient is world_size x its slice of the
    # 1-process gradient, and DDP's mean over processes gives the 1-process parameter gradient.
    torch.testing.assert_close(torch.cat([r["grad"] for r in results]), 2 * full["grad"])
    for name, grad in full["params"].items():
        torch.testing.assert_close((results[0]["params"][name] + results[1]["params"][name]) / 2, grad, msg=name)
    for name, buffer in full["buffers"].items():  # equal on both processes, and to one process's
        for r in results:
            torch.testing.assert_close(r["buffers"][name], buffer, msg=name, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(results[0]["eval_out"], full["eval_out"])


@pytest.mark.slow
def test_float32_statistics_stay_exact_far_from_zero(two_processes):
    reference = small_net()(batch(offset=1000.0)[0].float().double())  # float64, one process, the whole batch
    torch.testing.assert_close(torch.cat([r["float32"] for r in two_processes]).double(), reference, rtol=0, atol=2e-3)


def test_plain_batchnorm_would_differ_here():
    """The test above can fail: per-process statistics give other outputs on this batch."""
    net = small_net()
    images, _ = batch()
    local = torch.cat([net(images[:4]), net(images[4:])])
    assert not torch.allclose(local, small_net()(images))


def test_one_process_and_a_group_of_one_are_plain_batchnorm():
    # A process group of one, in this process (torch's class would raise on the CPU).
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        single = _steps(0, 1, 1)
    finally:
        dist.destroy_process_group()
    full = one_process(1)
    torch.testing.assert_close(single["out"], full["out"])
    torch.testing.assert_close(single["grad"], full["grad"])
    without_group = _steps(0, 1, 1)  # no process group at all
    torch.testing.assert_close(without_group["out"], full["out"])
    torch.testing.assert_close(without_group["eval_out"], full["eval_out"])


def test_conversion_keeps_state_and_leaves_other_layers():
    net = small_net()
    state = {k: v.clone() for k, v in net.state_dict().items()}
    weight = net[1].weight
    converted = convert_sync_batchnorm(net, "cpu")
    assert converted is net and type(net[1]) is GlobalBatchNorm and type(net[8]) is GlobalBatchNorm
    assert net[1].weight is weight  # the same parameter: optimizers and requires_grad carry over
    assert set(net.state_dict()) == set(state)  # checkpoints load either way
    for key, value in net.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert (
        sum(type(m) is GlobalBatchNorm for m in convert_sync_batchnorm(build_backbone("resnet18", 4), "cpu").modules())
        == 20
    )
    # Where torch's kernels run, torch's own class (converting needs no GPU; running it would).
    on_gpu = convert_sync_batchnorm(small_net(), "cuda")
    assert type(on_gpu[1]) is nn.SyncBatchNorm and type(on_gpu[5]) is nn.SyncBatchNorm


def test_every_batchnorm_of_a_method_is_converted_and_moco_split_batchnorm_is_refused():
    cfg = config_from_dict(
        {
            "method": {"name": "simclr"},
            "model": {"width": 4, "projector_hidden": 16, "projector_out": 8, "sync_batchnorm": True},
        }
    )
    method = convert_sync_batchnorm(build_method(cfg, build_backbone("resnet18", 4), 10, 100), "cpu")
    norms = [m for m in method.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert len(norms) == 21 and all(type(m) is GlobalBatchNorm for m in norms)  # backbone 20, projector 1
    with pytest.raises(UserError, match="bn_splits=1"):  # checked with the recipe, before anything is built
        moco = {"name": "moco", "bn_splits": 8}
        config_from_dict({"method": moco, "model": {"sync_batchnorm": True}, "train": {"batch_size": 16}})


def test_torch_sync_devices_without_torchs_private_backend_name_getter(monkeypatch):
    """The PrivateUse1 backend's device type comes from a private torch getter, guarded: without it
    the public default name is used, the name the getter gives while no plugin renames the backend."""
    from sslkit.models import sync_batchnorm

    private = sync_batchnorm._privateuse1_backend_name()
    assert sync_batchnorm._TORCH_SYNC_DEVICES == ("cuda", "xpu", "hpu", private)
    monkeypatch.delattr(torch._C, "_get_privateuse1_backend_name")
    assert sync_batchnorm._privateuse1_backend_name() == private == "privateuseone"
