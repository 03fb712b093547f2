"""Statistics over seeds: the mean and spread of a figure, and the paired difference of two.

A seed fixes what varies between repeats of an experiment (the labelled images, the initial
weights, the order of the batches). Two figures measured on the same seeds are compared seed by
seed: the differences take out what the seed does to both, which a difference of two means keeps.

>>> mean_std([0.7, 0.9])
(0.8, 0.14142135623730956)
>>> paired_difference({0: 0.8, 1: 0.7, 2: 0.6}, {0: 0.7, 1: 0.75, 2: 0.5})["seeds_ahead"]
2
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping, Sequence


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """The mean and the sample standard deviation (n - 1) of ``values``.

    Returns:
        (mean, std): the mean is None without values, the standard deviation None with fewer than two.
    """
    mean = statistics.fmean(values) if values else None
    return mean, statistics.stdev(values) if len(values) > 1 else None


def paired_difference(values: Mapping[Hashable, float], baseline: Mapping[Hashable, float]) -> dict | None:
    """``values`` minus ``baseline``, seed by seed, over the seeds both have.

    Args:
        values, baseline: a figure by seed.

    Returns:
        ``n_seeds``, ``gain_mean`` and ``gain_std`` (:func:`mean_std` of the differences) and
        ``seeds_ahead`` (on how many seeds ``values`` is the higher); None when no seed is in both.
    """
    diffs = [value - baseline[seed] for seed, value in values.items() if seed in baseline]
    if not diffs:
        return None
    mean, std = mean_std(diffs)
    return {"n_seeds": len(diffs), "gain_mean": mean, "gain_std": std, "seeds_ahead": sum(d > 0 for d in diffs)}
