"""ProbCover: label the images whose delta-balls cover the most images no label covers yet.

Yehuda, Dekel, Hacohen & Weinshall, "Active Learning Through a Covering Lens", NeurIPS 2022
(https://arxiv.org/abs/2205.11320). On L2-normalised features, the graph has an edge x -> y when
``||x - y|| < delta`` (every image has one to itself). Images within delta of a labelled image are
covered already; then, ``budget`` times, the image of largest out-degree among the uncovered
images is taken, and every image it covers leaves the graph.

What follows the paper and what follows its code (github.com/avihu111/TypiClust,
``deep-al/pycls/al/prob_cover.py``):

- paper and code: the graph, its strict ``<``, and the greedy cover above.
- code: the image of largest degree is the first of them (the paper breaks ties at random; the
  code's comment says so); here the lowest row.
- neither: the code, once every image is covered, keeps taking row 0; here the rest of the budget
  is drawn at random (seeded) from the unlabelled images, and :class:`Cover` says how many were.
- delta: the paper chooses the largest delta whose *purity* is at least alpha = 0.95 -- the share
  of images whose delta-ball holds images of one k-means pseudo-class only (k = the number of
  classes). The code takes delta as a setting; scikit-activeml's ``ProbCover`` implements the
  paper's choice, over a grid, taking the largest grid value before the first one whose purity
  falls below alpha (the smallest one, with a warning, when none reaches it). The same here, on a
  finer grid (:data:`DELTA_GRID`, 0.01 to 2 in steps of 0.01; scikit-activeml's steps are 0.2):
  purity only falls as delta grows, and an image is pure at every delta up to its distance to the
  nearest image of another pseudo-class, so one pass over the images prices the whole grid.

Memory: the graph is built a block of rows at a time and kept as sparse edges (CSR, int32 columns);
:data:`MAX_EDGES` bounds it (a delta so large that it links most images to most others would need
the dense matrix), and a larger graph is refused with one line asking for a smaller delta.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from sslkit.errors import UserError
from sslkit.evaluation.clustering import FULL_KMEANS_MAX_CLUSTERS, kmeans
from sslkit.evaluation.search import BLOCK_ROWS, squared_distance_blocks

PURITY_THRESHOLD = 0.95  # the paper's alpha
DELTA_GRID = np.round(np.arange(1, 201) * 0.01, 2)
MAX_EDGES = 300_000_000  # 1.2 GB of int32 columns


@dataclasses.dataclass(frozen=True)
class RadiusGraph:
    """The edges x -> y with ``||x - y|| < delta``, as CSR: row x's neighbours are ``columns[starts[x]:starts[x+1]]``.

    The graph is symmetric, so a row's neighbours are also the rows with an edge into it.
    """

    starts: np.ndarray  # (N + 1,) int64
    columns: np.ndarray  # (E,) int32
    delta: float

    def neighbours(self, row: int) -> np.ndarray:
        return self.columns[self.starts[row] : self.starts[row + 1]]


@dataclasses.dataclass(frozen=True)
class Cover:
    """What ProbCover chose and how well it covers.

    Attributes:
        picks: the rows chosen, in order.
        delta: the ball radius used.
        purity: the purity of ``delta`` (None when delta was given).
        covered: the share of images covered by the labelled images and the picks.
        random_picks: picks drawn at random once everything was covered.
    """

    picks: np.ndarray
    delta: float
    purity: float | None
    covered: float
    random_picks: int


def radius_graph(features: torch.Tensor, delta: float, max_edges: int = MAX_EDGES) -> RadiusGraph:
    """Every edge x -> y with ``||x - y|| < delta``, computed a block of rows at a time.

    Raises:
        UserError: more than ``max_edges`` edges (delta is too large for memory).

    Shape:
        features: (N, D) unit rows.
    """
    counts, columns, total = [], [], 0
    near = torch.empty(min(BLOCK_ROWS, len(features)), len(features), dtype=torch.bool)  # reused, as the distances
    for start, stop, distances in squared_distance_blocks(features, features):
        block = torch.lt(distances, delta * delta, out=near[: stop - start])
        block_rows, block_columns = block.nonzero(as_tuple=True)  # row-major: sorted by row
        total += len(block_columns)
        if total > max_edges:
            raise UserError(
                f"ProbCover's graph at delta={delta:g} has over {max_edges:,} edges (each image within delta of "
                f"{total / stop:.0f} others on average), too many to hold; give a smaller --delta"
            )
        counts.append(torch.bincount(block_rows, minlength=stop - start))
        columns.append(block_columns.to(torch.int32))
    starts = np.zeros(len(features) + 1, dtype=np.int64)
    np.cumsum(torch.cat(counts).numpy(), out=starts[1:])
    return RadiusGraph(starts, torch.cat(columns).numpy(), float(delta))


def impure_distances(features: torch.Tensor, pseudo_labels: np.ndarray) -> torch.Tensor:
    """Each image's distance to the nearest image of another pseudo-class: its delta-ball is pure for every
    delta up to it (``<`` edges), and impure beyond.

    Shape:
        features: (N, D) unit rows; pseudo_labels: (N,); returns: (N,).
    """
    labels = torch.from_numpy(pseudo_labels)
    out = torch.empty(len(features))
    same = torch.empty(min(BLOCK_ROWS, len(features)), len(features), dtype=torch.bool)  # reused, as the distances
    for start, stop, distances in squared_distance_blocks(features, features):
        torch.eq(labels[start:stop, None], labels[None, :], out=same[: stop - start])
        distances.masked_fill_(same[: stop - start], float("inf"))
        out[start:stop] = distances.min(dim=1).values.sqrt()
    return out


def purity(impure: torch.Tensor, delta: float) -> float:
    """The share of images whose delta-ball holds one pseudo-class: those with no other class nearer than delta."""
    return float((impure >= delta).float().mean())


def choose_delta(features: torch.Tensor, classes: int, seed: int) -> tuple[float, float]:
    """The largest delta of :data:`DELTA_GRID` before the first whose purity falls below :data:`PURITY_THRESHOLD`,
    for k-means pseudo-labels of ``classes`` clusters (scikit-activeml's rule, on a finer grid).

    Returns:
        (delta, its purity); the smallest grid value when even that one is impure.
    """
    pseudo_labels, _ = kmeans(features, classes, seed, minibatch_beyond=FULL_KMEANS_MAX_CLUSTERS)
    impure = impure_distances(features, pseudo_labels)
    chosen = float(DELTA_GRID[0])
    for delta in DELTA_GRID:
        if purity(impure, float(delta)) < PURITY_THRESHOLD:
            break
        chosen = float(delta)
    return chosen, purity(impure, chosen)


def greedy_cover(graph: RadiusGraph, budget: int, labelled: np.ndarray, seed: int) -> tuple[np.ndarray, int, float]:
    """The greedy maximum cover: ``budget`` times, the row covering the most uncovered rows.

    A row's out-degree counts its uncovered neighbours; when a row is covered, each of its
    neighbours (the rows with an edge into it) loses one.

    Returns:
        (the picks in order, how many of them were drawn at random once all was covered, the share covered).
    """
    count = len(graph.starts) - 1
    covered = np.zeros(count, dtype=bool)
    degrees = np.diff(graph.starts)
    available = ~labelled
    picks: list[int] = []

    def cover(rows: np.ndarray) -> None:
        new = np.unique(np.concatenate([graph.neighbours(r) for r in rows] or [np.empty(0, np.int32)]))
        new = new[~covered[new]]
        covered[new] = True
        if len(new):
            degrees[:] -= np.bincount(np.concatenate([graph.neighbours(r) for r in new]), minlength=count)

    cover(np.flatnonzero(labelled))
    while len(picks) < budget:
        best = int(np.argmax(np.where(available, degrees, -1)))
        if degrees[best] == 0:
            break
        picks.append(best)
        available[best] = False
        cover(np.array([best]))
    share = float(covered.mean())
    random_picks = budget - len(picks)
    if random_picks:
        rest = np.random.default_rng(seed).choice(np.flatnonzero(available), random_picks, replace=False)
        picks.extend(int(r) for r in rest)
    return np.asarray(picks, dtype=np.int64), random_picks, share


def probcover(
    features: torch.Tensor,
    budget: int,
    labelled: np.ndarray,
    seed: int,
    delta: float | None,
    classes: int | None,
) -> Cover:
    """ProbCover's picks (see the module docstring), at ``delta``, or at the delta that purity chooses for
    ``classes`` pseudo-classes.

    Shape:
        features: (N, D) unit rows; labelled: (N,) bool.
    """
    chosen_purity = None
    if delta is None:
        delta, chosen_purity = choose_delta(features, classes, seed)
    graph = radius_graph(features, delta)
    picks, random_picks, share = greedy_cover(graph, budget, labelled, seed)
    return Cover(picks, delta, chosen_purity, share, random_picks)
