"""The order a training loader visits its dataset, each epoch a pure function of ``(seed, epoch)``.

Why not ``RandomSampler``: its order depends on the global RNG at the moment the epoch starts,
so a resumed run would see different batches. Here ``set_epoch`` picks the order, and a run
resumed mid-epoch (Accelerate's ``skip_first_batches``) continues with the very batches it
would have seen.

A training loader takes its order as batches (:class:`EpochBatchSampler` over either order below, or a
method's own, such as FixMatch's two streams, :mod:`sslkit.datasets.two_streams`); with loader workers that
augment, :class:`KeyedBatchSampler` hands them each sample's place in the epoch with its index.

Two orders (``data.sampler``):

- ``random`` (:class:`EpochShuffleSampler`): a permutation of the dataset;
- ``m_per_class`` (:class:`MPerClassSampler`): class-balanced P x K batches for metric learning,
  ``P = batch / m`` classes of ``m`` images each (MPerClassSampler in Musgrave et al., "A Metric
  Learning Reality Check", 2020, https://arxiv.org/abs/2003.08505, m = 4).

Several processes: every process draws the same index stream from ``(seed, epoch)``, and
Accelerate hands process ``r`` the ``r``-th of every ``W`` consecutive local batches. A global
batch of :class:`MPerClassSampler` is ``W`` local batches of whole classes, so each process trains
on its own classes, disjoint from the other processes', and the global batch is P x m.
"""

from __future__ import annotations

import torch
from torch.utils.data import BatchSampler, Sampler

from sslkit.datasets.augmented import SampleKey
from sslkit.errors import UserError

SAMPLERS = ("random", "m_per_class")


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator that draws epoch ``epoch``'s order: the same on every process and machine."""
    return torch.Generator().manual_seed(seed * 100_003 + epoch)


class EpochShuffleSampler(Sampler[int]):
    """A permutation of the dataset that depends only on ``(seed, epoch)``."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(torch.randperm(self.size, generator=epoch_generator(self.seed, self.epoch)).tolist())

    def __len__(self) -> int:
        return self.size


class MPerClassSampler(Sampler[int]):
    """Batches of ``batch_size / m`` distinct classes, ``m`` images each, every image about once an epoch.

    An epoch, drawn from ``(seed, epoch)``:

    1. each class's images are shuffled and cut into groups of ``m``; a last, short group is filled
       up with the images before it (so no image repeats within a group), and a class with fewer than
       ``m`` images is completed with repeats drawn from its own (with replacement);
    2. a batch takes one group from each of ``P = batch_size / m`` distinct classes, drawn at random
       with weights equal to the groups each class has left (so the classes run out together);
    3. once fewer than ``P`` classes have groups left, a batch is completed with fresh groups of
       classes drawn uniformly from the others.

    The epoch has ``floor(groups / P)`` batches (``groups`` fixed by the class sizes), so every
    image is used once, apart from the filled-up groups and the completions of the last batches.
    No class appears twice in a batch.

    Args:
        labels: the class of every training image (no -1).
        m: images per class in a batch.
        batch_size: the global batch (all processes together), a multiple of ``m``.
        seed: with the epoch, picks the order.

    Shape:
        labels: (N,) int64.

    >>> labels = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3])  # 5 groups of 2: classes 0, 1, 3 one each, class 2 two
    >>> order = torch.tensor(list(MPerClassSampler(labels, m=2, batch_size=4, seed=0)))
    >>> [len(set(batch.tolist())) for batch in labels[order].view(-1, 4)]  # 2 batches of 2 classes x 2 images
    [2, 2]
    """

    def __init__(self, labels: torch.Tensor, m: int, batch_size: int, seed: int) -> None:
        if m < 1:
            raise ValueError(f"m must be at least 1, got {m}")
        if batch_size % m:
            raise ValueError(f"batch_size {batch_size} must be a multiple of m={m}")
        if bool((labels < 0).any()):
            raise ValueError(f"labels: {int((labels < 0).sum())} images are unlabelled (-1)")
        self.m, self.batch_size, self.seed, self.epoch = m, batch_size, seed, 0
        self.classes_per_batch = batch_size // m
        # Each class's images, contiguous: members[starts[c] : starts[c] + counts[c]].
        self.labels = labels
        self.classes, self.counts = torch.unique(labels, return_counts=True)
        self.members = torch.argsort(labels, stable=True)
        self.starts = torch.cumsum(self.counts, 0) - self.counts
        if self.classes_per_batch > len(self.classes):
            raise ValueError(
                f"a batch of {batch_size} with m={m} needs {self.classes_per_batch} classes, but there are "
                f"only {len(self.classes)}"
            )
        self.groups = -(-self.counts // m)  # groups of m per class
        self.first = torch.cumsum(self.groups, 0) - self.groups  # each class's first group
        self.num_batches = int(self.groups.sum()) // self.classes_per_batch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_batches * self.batch_size

    def _fresh_group(self, c: int, generator: torch.Generator) -> torch.Tensor:
        """``m`` images of class ``c`` (its position in ``classes``), repeats only when it has fewer."""
        count, start = int(self.counts[c]), int(self.starts[c])
        if count >= self.m:
            pick = torch.randperm(count, generator=generator)[: self.m]
        else:
            pick = torch.randint(count, (self.m,), generator=generator)
        return self.members[start + pick]

    def _class_groups(self, generator: torch.Generator) -> torch.Tensor:
        """Step 1: the groups of every class, class by class, each class's in a random order.

        Shape:
            returns: (sum of groups, m), the rows of class ``c`` from ``first[c]`` on.
        """
        # Each class's images in a random order, still contiguous: sort a random permutation by label.
        shuffled = torch.randperm(len(self.members), generator=generator)
        order = shuffled[torch.argsort(self.labels[shuffled], stable=True)]
        owner = torch.repeat_interleave(torch.arange(len(self.classes)), self.groups)  # (G,) class of each group
        k = torch.arange(len(owner)) - self.first[owner]  # each group's rank in its class
        count = self.counts[owner]
        # Group k starts at k * m; a class's last group ends at its last image (so it overlaps the one before).
        base = self.starts[owner] + torch.minimum(k * self.m, (count - self.m).clamp(min=0))
        slot = torch.arange(self.m).expand(len(owner), self.m)
        repeat = (torch.rand(len(owner), self.m, generator=generator) * count[:, None]).long()
        slot = torch.where(slot < count[:, None], slot, repeat)  # a class with fewer than m: with replacement
        return order[base[:, None] + slot]

    def __iter__(self):
        generator = epoch_generator(self.seed, self.epoch)
        groups = self._class_groups(generator)  # (G, m)
        used = torch.zeros(len(self.classes), dtype=torch.int64)
        batches = []
        for _ in range(self.num_batches):
            left = (self.groups - used).double()
            ready = min(int((left > 0).sum()), self.classes_per_batch)
            chosen = torch.multinomial(left, ready, generator=generator) if ready else used[:0]
            batch = [groups[self.first[chosen] + used[chosen]].flatten()]
            used[chosen] += 1
            if ready < self.classes_per_batch:  # step 3: too few classes left to fill the batch
                others = torch.ones(len(self.classes), dtype=torch.double)
                others[chosen] = 0
                extra = torch.multinomial(others, self.classes_per_batch - ready, generator=generator)
                batch += [self._fresh_group(c, generator) for c in extra.tolist()]
            batches.append(torch.cat(batch))
        return iter(torch.cat(batches).tolist() if batches else [])


class EpochBatchSampler(BatchSampler):
    """``sampler``'s order cut into batches of ``batch_size`` (the last, short one dropped), its epoch passed on.

    Each process's batches: Accelerate hands process ``r`` the ``r``-th of every ``W`` of them.
    """

    def __init__(self, sampler: EpochShuffleSampler | MPerClassSampler, batch_size: int) -> None:
        super().__init__(sampler, batch_size, drop_last=True)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)


class KeyedBatchSampler(Sampler[list[SampleKey]]):
    """``batches``' indices, each with its epoch and position, for loader workers that augment
    (``data.augment_in_workers``; :class:`~sslkit.datasets.augmented.AugmentInWorkers`).

    A position counts over every process's batches, ``batch number x batch_size + place in the batch``
    (every batch is full), so that a batch's first position names it among all processes' batches.
    """

    drop_last = True

    def __init__(self, batches: EpochBatchSampler | Sampler[list[int]]) -> None:
        self.batches, self.batch_size = batches, batches.batch_size

    def set_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        epoch, size = self.batches.epoch, self.batch_size
        for number, batch in enumerate(self.batches):
            yield [SampleKey(index, epoch, number * size + place) for place, index in enumerate(batch)]


def training_sampler(
    name: str, labels: torch.Tensor, m: int, batch_size: int, local_batch: int, seed: int
) -> EpochShuffleSampler | MPerClassSampler:
    """The training order ``data.sampler`` names, over a training set of ``labels``.

    Args:
        name: one of :data:`SAMPLERS`.
        labels: the training set's labels.
        m: ``data.m_per_class``.
        batch_size: the global batch (``train.batch_size``).
        local_batch: each process's share of it.
        seed: ``run.seed``.

    Raises:
        UserError: a class-balanced order the training set or the batch cannot give.
    """
    if name == "random":
        return EpochShuffleSampler(len(labels), seed)
    _check_m_per_class(labels, m, batch_size, local_batch)
    return MPerClassSampler(labels, m, batch_size, seed)


def _check_m_per_class(labels: torch.Tensor, m: int, batch_size: int, local_batch: int) -> None:
    if local_batch % m:
        raise UserError(
            f"data.sampler=m_per_class: each process's batch ({local_batch}) must be a multiple of "
            f"data.m_per_class={m}, so that a class's images stay on one process; choose train.batch_size "
            f"as a multiple of {m} x the number of processes"
        )
    unlabelled = int((labels < 0).sum())
    if unlabelled:
        raise UserError(
            f"data.sampler=m_per_class needs a label for every training image, but {unlabelled} have none; "
            f"train on a labelled split (data.train_split=train) or use data.sampler=random"
        )
    classes = int(torch.unique(labels).numel())
    if batch_size // m > classes:
        raise UserError(
            f"data.sampler=m_per_class: a batch of {batch_size} at data.m_per_class={m} needs {batch_size // m} "
            f"classes, but the training set has {classes}; raise data.m_per_class to at least "
            f"{-(-batch_size // classes)} or lower train.batch_size"
        )
