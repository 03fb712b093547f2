"""Batches drawn from two streams at once: labelled images and unlabelled ones, for semi-supervised methods.

FixMatch (Sohn et al. 2020, https://arxiv.org/abs/2001.07685, algorithm 1) trains every step on
``B`` labelled images and ``mu B`` unlabelled ones. One loader yields both, each batch the labelled
indices first, then the unlabelled ones, so that one sampler holds the whole data order and a
resumed run, which skips the batches it has seen (Accelerate's ``skip_first_batches``), continues
with the very batches it would have drawn:

- the **unlabelled stream** is every training image, labelled or not, as in the paper (its
  unlabelled set is the whole training set with the labels dropped);
- the **labelled stream** is the images with a label (``label >= 0``: the run's label subset);
- an **epoch** is one pass over the unlabelled stream: ``floor(N / (mu B))`` steps, the last
  ``N mod mu B`` images of the epoch's permutation left out. The labelled stream cycles within
  it, a fresh permutation of the labelled images each time one runs out.

Both orders of epoch ``e`` are drawn from one generator seeded by ``(seed, e)``
(:func:`~sslkit.datasets.samplers.epoch_generator`): the unlabelled permutation first, then as many
labelled permutations as the epoch uses. Nothing else is state.

Several processes: the sampler yields each process's share of a step as one batch (``b = B / W``
labelled and ``mu b`` unlabelled indices), the ``W`` shares of a step consecutively, cut from
consecutive stretches of both streams. Accelerate hands process ``r`` the ``r``-th of every ``W``
batches, so within a step the processes' unlabelled images are disjoint, and their labelled ones too
unless the step straddles two passes over the labelled images (an image can end one pass and start
the next).

>>> labels = torch.tensor([0, 1, -1, -1, -1, -1, -1, -1])  # two labelled images of eight
>>> sampler = TwoStreamBatchSampler(labels, labelled_batch=1, unlabelled_ratio=2, seed=0)
>>> len(sampler), [len(batch) for batch in sampler]  # floor(8 / 2) steps of 1 + 2 indices
(4, [3, 3, 3, 3])
>>> all(int(labels[batch[0]]) >= 0 for batch in sampler)  # the labelled index comes first
True
"""

from __future__ import annotations

import torch
from torch.utils.data import Sampler

from sslkit.datasets.samplers import epoch_generator
from sslkit.errors import UserError


class TwoStreamBatchSampler(Sampler[list[int]]):
    """Per-process batches of ``labelled_batch`` labelled indices, then ``unlabelled_ratio`` times as many of any.

    Args:
        labels: the class of every training image, -1 for an unlabelled one.
        labelled_batch: ``b``, labelled images in each process's batch (``train.batch_size / W``).
        unlabelled_ratio: ``mu``, unlabelled images per labelled one.
        seed: with the epoch, picks both orders.
        num_processes: ``W``; the epoch's batches are a multiple of it, ``W`` a step.

    Attributes:
        batch_size: ``(1 + mu) b``, every batch's length (Accelerate reads it).
        drop_last: True: there is never a short batch.

    Shape:
        labels: (N,) int64; yields lists of ``(1 + mu) b`` indices into it.
    """

    drop_last = True

    def __init__(
        self, labels: torch.Tensor, labelled_batch: int, unlabelled_ratio: int, seed: int, num_processes: int = 1
    ) -> None:
        if labelled_batch < 1 or unlabelled_ratio < 1 or num_processes < 1:
            raise ValueError(
                f"labelled_batch, unlabelled_ratio and num_processes must be >= 1, got "
                f"{labelled_batch}, {unlabelled_ratio} and {num_processes}"
            )
        self.labelled = (labels >= 0).nonzero().flatten()  # (L,)
        if len(self.labelled) == 0:
            raise ValueError("labels: no image has a label, so there is no labelled stream")
        self.size, self.seed, self.epoch = len(labels), seed, 0
        self.labelled_batch, self.unlabelled_batch = labelled_batch, labelled_batch * unlabelled_ratio
        self.num_processes = num_processes
        self.batch_size = self.labelled_batch + self.unlabelled_batch
        self.steps = self.size // (self.unlabelled_batch * num_processes)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.steps * self.num_processes

    def __iter__(self):
        generator = epoch_generator(self.seed, self.epoch)
        batches = len(self)
        unlabelled = torch.randperm(self.size, generator=generator)[: batches * self.unlabelled_batch]
        needed = batches * self.labelled_batch
        passes = -(-needed // len(self.labelled))
        order = [self.labelled[torch.randperm(len(self.labelled), generator=generator)] for _ in range(passes)]
        labelled = torch.cat(order)[:needed] if order else self.labelled[:0]
        rows = torch.cat(
            [labelled.view(batches, self.labelled_batch), unlabelled.view(batches, self.unlabelled_batch)], dim=1
        )  # (batches, (1 + mu) b)
        return iter(rows.tolist())


def two_stream_sampler(
    labels: torch.Tensor, batch_size: int, local_batch: int, unlabelled_ratio: int, seed: int, method: str
) -> TwoStreamBatchSampler:
    """The two streams over a training set of ``labels``, or one line saying why they cannot be drawn.

    Args:
        labels: the training set's labels (-1: unlabelled).
        batch_size: ``B``, labelled images in a step (``train.batch_size``).
        local_batch: each process's share of ``B``.
        unlabelled_ratio: ``mu`` (``method.mu``).
        seed: ``run.seed``.
        method: the method's name, for the messages.

    Raises:
        UserError: no labelled image, no unlabelled one, or fewer images than one step's ``mu B``.
    """
    labelled, count = int((labels >= 0).sum()), len(labels)
    if labelled == 0:
        raise UserError(
            f"method '{method}' needs labelled images, but none of the {count} training images has a label; "
            f"train on a labelled split (data.train_split=train) with data.label_fraction or data.labels_per_class"
        )
    if labelled == count:
        raise UserError(
            f"method '{method}' learns from unlabelled images, but all {count} training images are labelled; "
            f"keep a labelled subset: data.label_fraction (e.g. 0.01) or data.labels_per_class"
        )
    if batch_size * unlabelled_ratio > count:
        raise UserError(
            f"a step of method '{method}' draws train.batch_size x method.mu = {batch_size} x {unlabelled_ratio} "
            f"unlabelled images, more than the {count} training images; lower train.batch_size or method.mu"
        )
    return TwoStreamBatchSampler(labels, local_batch, unlabelled_ratio, seed, batch_size // local_batch)
