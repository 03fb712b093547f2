"""Training orders: the class-balanced P x K sampler in one and two real processes, coverage, resume."""

import os
import sys
from types import SimpleNamespace

import pytest
import torch

from sslkit.config import config_from_dict
from sslkit.datasets import DatasetInfo, EpochShuffleSampler, ImageTensorDataset, MPerClassSampler, training_sampler
from sslkit.errors import UserError

sys.path.insert(0, os.path.dirname(__file__))
from dist_utils import run_in_processes  # noqa: E402


def class_sizes(sizes: list[int], seed: int = 0) -> torch.Tensor:
    """Labels of classes with the given sizes, in a shuffled order (a dataset is not sorted by class)."""
    labels = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))]


def sop_like(classes: int, seed: int = 0) -> torch.Tensor:
    """Stanford Online Products' shape: many classes of 2 to 8 images (about 5)."""
    return class_sizes(torch.randint(2, 9, (classes,), generator=torch.Generator().manual_seed(seed)).tolist(), seed)


def batches_of(sampler, batch_size: int) -> torch.Tensor:
    order = torch.tensor(list(sampler))
    assert len(order) == len(sampler) and len(order) % batch_size == 0
    return order.view(-1, batch_size)


@pytest.mark.parametrize("m, batch_size", [(4, 32), (2, 8), (5, 20)])
def test_every_batch_is_p_distinct_classes_of_m_images(m, batch_size):
    labels = sop_like(60)
    batches = batches_of(MPerClassSampler(labels, m, batch_size, seed=1), batch_size)
    for batch in batches:
        groups = labels[batch].view(-1, m)  # (P, m): one class per group
        assert bool((groups == groups[:, :1]).all())
        assert len(set(groups[:, 0].tolist())) == batch_size // m  # no class twice in a batch


def test_a_group_holds_distinct_images_and_a_small_class_all_of_its_own():
    labels = class_sizes([2, 3, 9, 4, 7, 1, 12, 6])
    m = 4
    for group in batches_of(MPerClassSampler(labels, m, 8, seed=0), 8).view(-1, m):
        size = int((labels == labels[group[0]]).sum())
        assert len(set(group.tolist())) == min(size, m)  # repeats only in a class smaller than m


def test_every_image_is_used_about_once_an_epoch():
    labels = sop_like(2000)
    sampler = MPerClassSampler(labels, 4, 256, seed=0)
    order = torch.tensor(list(sampler))
    uses = torch.bincount(order, minlength=len(labels))
    # groups = sum ceil(n / 4) per class; the epoch keeps floor(groups / 64) batches of 64 groups
    groups = sum(-(-int(n) // 4) for n in torch.bincount(labels))
    assert len(order) == groups // 64 * 256
    assert float((uses >= 1).double().mean()) > 0.99
    assert int(uses.max()) <= 3


def test_the_order_is_a_function_of_seed_and_epoch():
    labels = sop_like(50)
    first, again, other = (MPerClassSampler(labels, 4, 16, seed=s) for s in (3, 3, 4))
    assert list(first) == list(again) and list(first) != list(other)
    epoch0 = list(first)
    first.set_epoch(1)
    assert list(first) != epoch0
    first.set_epoch(0)
    assert list(first) == epoch0


def test_training_sampler_names_and_mistakes():
    labels = class_sizes([6] * 10)
    assert isinstance(training_sampler("random", labels, 4, 16, 16, 0), EpochShuffleSampler)
    assert isinstance(training_sampler("m_per_class", labels, 4, 16, 8, 0), MPerClassSampler)
    with pytest.raises(UserError, match=r"batch \(6\) must be a multiple of data.m_per_class=4"):
        training_sampler("m_per_class", labels, 4, 12, 6, 0)
    with pytest.raises(UserError, match="needs 16 classes, but the training set has 10; raise data.m_per_class to"):
        training_sampler("m_per_class", labels, 4, 64, 64, 0)
    with pytest.raises(UserError, match="2 have none"):
        training_sampler("m_per_class", torch.cat([labels, torch.tensor([-1, -1])]), 4, 16, 16, 0)
    with pytest.raises(ValueError, match="multiple of m=4"):
        MPerClassSampler(labels, 4, 18, 0)


@pytest.mark.parametrize(
    "data, words",
    [
        ({"sampler": "pk"}, ["unknown data.sampler 'pk'", "m_per_class", "random"]),
        ({"sampler": "m_per_class", "m_per_class": 0}, ["data.m_per_class", ">= 1"]),
        ({"sampler": "m_per_class", "name": "webdataset"}, ["tar shards are unlabelled"]),
    ],
)
def test_recipe_mistakes_name_the_key(data, words):
    with pytest.raises(UserError) as error:
        config_from_dict({"data": data})
    assert all(word in str(error.value) for word in words), str(error.value)


# --------------------------------------------------------------------------- the training loader


def tiny_dataset(labels: torch.Tensor) -> ImageTensorDataset:
    """Images whose single pixel is their index, so a batch says which images it holds."""
    images = torch.arange(len(labels), dtype=torch.uint8).view(-1, 1, 1, 1)
    return ImageTensorDataset(
        images, labels, [str(c) for c in range(int(labels.max()) + 1)], DatasetInfo(1, 1, 1, (0.5,), (0.2,))
    )


def epoch_of(rank: int, world: int, labels: torch.Tensor, skip: int = 0) -> list[list[int]]:
    """The images of each batch this process trains on in epoch 1 (after ``skip`` batches), loaded as in training."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    from accelerate import Accelerator

    from sslkit.loop.build import make_train_loader
    from sslkit.loop.run import epoch_batches
    from sslkit.loop.state import LoopState

    accelerator = Accelerator(cpu=True)
    cfg = config_from_dict({"data": {"sampler": "m_per_class", "m_per_class": 4}, "train": {"batch_size": 32}})
    loader, sampler = make_train_loader(cfg, tiny_dataset(labels), cfg.train.batch_size // world)
    # The parts of a Run that epoch_batches reads.
    run = SimpleNamespace(
        loader=accelerator.prepare(loader), sampler=sampler, accelerator=accelerator,
        progress=LoopState(epoch=1, batch_in_epoch=skip),
    )  # fmt: skip
    batches = epoch_batches(run)
    return [images.flatten().tolist() for images, _ in batches]


def two_process_epochs(rank: int, world: int, labels: torch.Tensor) -> tuple[list, list]:
    return epoch_of(rank, world, labels), epoch_of(rank, world, labels, skip=2)


@pytest.mark.slow
def test_two_processes_share_one_global_pk_batch_with_disjoint_classes():
    labels = sop_like(40, seed=2)
    (local0, resumed0), (local1, resumed1) = run_in_processes(two_process_epochs, labels)
    assert resumed0 == local0[2:] and resumed1 == local1[2:]  # exact mid-epoch resume
    sampler = MPerClassSampler(labels, 4, 32, seed=config_from_dict({}).run.seed)
    sampler.set_epoch(1)
    one_process = batches_of(sampler, 32).tolist()
    assert len(local0) == len(local1) == len(one_process) > 2
    for first, second, whole in zip(local0, local1, one_process):
        assert first + second == whole  # the same global batch as one process would train on
        classes0, classes1 = set(labels[first].tolist()), set(labels[second].tolist())
        assert len(classes0) == len(classes1) == 4 and not classes0 & classes1  # 8 classes, 4 on each process
        assert torch.bincount(labels[first + second]).max() == 4


def test_the_sampler_benchmark_counts_positives_per_anchor():
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "tools", "bench", "sampler.py")
    spec = importlib.util.spec_from_file_location("bench_sampler", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.run(classes=300, batch_size=64, ms=[4], seed=0)["samplers"]
    assert rows["m_per_class, m=4"]["positives_per_anchor"] == 3.0
    assert rows["m_per_class, m=4"]["classes_per_batch"] == 16.0
    assert rows["random"]["positives_per_anchor"] < 0.5 and rows["random"]["coverage"] > 0.9
