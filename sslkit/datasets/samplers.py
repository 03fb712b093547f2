"""The order a training loader visits its dataset, each epoch a pure function of ``(seed, epoch)``.

Why not ``RandomSampler``: its order depends on the global RNG at the moment the epoch starts,
so a resumed run would see different batches. Here ``set_epoch`` picks the order, and a run
resumed mid-epoch (Accelerate's ``skip_first_batches``) continues with the very batches it
would have seen.
"""

from __future__ import annotations

import torch
from torch.utils.data import Sampler


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
