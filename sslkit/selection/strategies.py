"""``select``: which rows of an embeddings matrix to label next, by one of :data:`STRATEGIES`.

>>> import numpy as np
>>> vectors = np.random.default_rng(0).normal(size=(200, 8)).astype(np.float32)
>>> picks = select(vectors, 10, "kcenter", seed=0)
>>> len(picks), len(set(picks.tolist()))
(10, 10)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sslkit.errors import UserError
from sslkit.evaluation.search import unit_vectors
from sslkit.selection.choices import STRATEGIES
from sslkit.selection.clusters import nearest_to_centres, typiclust
from sslkit.selection.kcenter import kcenter_greedy
from sslkit.selection.probcover import probcover


def labelled_mask(count: int, labelled) -> np.ndarray:
    """``labelled`` rows as a boolean mask over ``count`` rows.

    Raises:
        UserError: a row outside ``[0, count)``.
    """
    mask = np.zeros(count, dtype=bool)
    if labelled is None:
        return mask
    rows = np.asarray(labelled, dtype=np.int64).reshape(-1)
    if len(rows) and (rows.min() < 0 or rows.max() >= count):
        bad = int(rows[(rows < 0) | (rows >= count)][0])
        raise UserError(f"labelled row {bad} is not among the {count} rows of the embeddings (0 to {count - 1})")
    mask[rows] = True
    return mask


def check_request(count: int, budget: int, strategy: str, labelled: np.ndarray) -> None:
    """One line for a budget of 0 or more than the unlabelled images, or an unknown strategy."""
    if strategy not in STRATEGIES:
        raise UserError(f"unknown strategy '{strategy}'; choose one of {', '.join(STRATEGIES)}")
    pool = count - int(labelled.sum())
    if not 1 <= budget <= pool:
        raise UserError(
            f"a budget of {budget} labels: give 1 to {pool}, the images not labelled yet "
            f"({count} in the embeddings, {count - pool} labelled)"
        )


@dataclasses.dataclass(frozen=True)
class Selection:
    """The rows a strategy chose, and what it measured on the way (ProbCover: delta, its purity, the coverage)."""

    rows: np.ndarray
    details: dict


def select(
    vectors: np.ndarray,
    budget: int,
    strategy: str,
    labelled=None,
    seed: int = 0,
    delta: float | None = None,
    classes: int | None = None,
) -> np.ndarray:
    """The ``budget`` rows of ``vectors`` to label next, in the order ``strategy`` chose them.

    Every strategy compares the rows after L2 normalisation. Labelled rows are never chosen again, and
    inform the choice: TypiClust visits the clusters they leave empty first, ProbCover drops what
    they cover, k-center moves away from them (random and kmeans only skip them).

    Args:
        vectors: the embeddings, one row per image (an embeddings folder's memory map will do).
        budget: how many rows to choose, 1 to the number of unlabelled rows.
        strategy: one of :data:`STRATEGIES`.
        labelled: rows labelled already (an active-learning round adds ``budget`` to them).
        seed: seeds k-means, random draws and k-center's first image without labels.
        delta: ProbCover's ball radius on normalised features (None: chosen by purity, needs ``classes``).
        classes: ProbCover's number of k-means pseudo-classes for the purity that chooses delta.

    Returns:
        (budget,) int64 row indices, none of them in ``labelled``.

    Raises:
        UserError: an unknown strategy, a budget of 0 or more than the unlabelled rows, a labelled row
            outside the matrix, ProbCover without ``delta`` or ``classes`` (or with fewer than 2), or a delta
            too large to hold.

    Shape:
        vectors: (N, D) float32 or float16.
    """
    return choose(vectors, budget, strategy, labelled, seed, delta, classes).rows


def choose(
    vectors: np.ndarray,
    budget: int,
    strategy: str,
    labelled=None,
    seed: int = 0,
    delta: float | None = None,
    classes: int | None = None,
) -> Selection:
    """:func:`select`, with what the strategy measured on the way."""
    mask = labelled_mask(len(vectors), labelled)
    check_request(len(vectors), budget, strategy, mask)
    if strategy == "random":
        rows = np.random.default_rng(seed).choice(np.flatnonzero(~mask), budget, replace=False)
        return Selection(rows.astype(np.int64), {})
    if strategy == "probcover":
        check_cover_settings(delta, classes)
    features = unit_vectors(vectors)
    if strategy == "kmeans":
        return Selection(nearest_to_centres(features, budget, mask, seed), {})
    if strategy == "typiclust":
        return Selection(typiclust(features, budget, mask, seed), {})
    if strategy == "kcenter":
        return Selection(kcenter_greedy(features, budget, mask, seed), {})
    cover = probcover(features, budget, mask, seed, delta, classes)
    details = {"delta": cover.delta, "purity": cover.purity, "covered": cover.covered}
    return Selection(cover.picks, {**details, "random_picks": cover.random_picks})


def check_cover_settings(delta: float | None, classes: int | None) -> None:
    """ProbCover needs a positive delta, or at least 2 pseudo-classes to choose one by purity."""
    if delta is not None and not delta > 0:
        raise UserError(f"--delta must be > 0 (a ball radius on unit vectors, 0 to 2), got {delta}")
    if delta is None and classes is None:
        raise UserError(
            "ProbCover chooses delta by purity over k-means pseudo-classes: give --classes K (the number of "
            "classes), or --delta by hand"
        )
    if delta is None and classes < 2:
        raise UserError(f"--classes must be at least 2 for delta's purity to mean anything, got {classes}")
