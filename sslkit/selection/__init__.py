"""Which images to label: choose a labelling budget's worth of images from their embeddings.

With few labels, which images carry them matters as much as how many: a class-balanced random 1%
can miss the typical image of a mode, label three near-copies, or spend labels on outliers. Given
the embeddings of every candidate image (an embeddings folder, :mod:`sslkit.embeddings.store`),
a strategy picks ``budget`` rows; ``sslkit-select`` writes them as a label file that
``data.label_subset`` trains any method on (:mod:`sslkit.selection.label_file`).

==============  ====================================================================
strategy        picks
==============  ====================================================================
``random``      uniformly at random among the unlabelled images
``kmeans``      the image nearest each of ``budget`` k-means centres
``typiclust``   the most typical image of each of ``labelled + budget`` clusters (TypiClust)
``probcover``   a greedy maximum cover by delta-balls, delta chosen by purity (ProbCover)
``kcenter``     farthest-first from the labelled images: greedy k-center (Coreset)
==============  ====================================================================

- :mod:`.strategies`  ``select(vectors, budget, strategy, labelled, seed)``: the row indices.
- :mod:`.clusters`    k-means centres and TypiClust.
- :mod:`.probcover`   ProbCover: the radius graph, delta by purity, the greedy cover.
- :mod:`.kcenter`     greedy k-center.
- :mod:`.label_file`  an embeddings folder in, a label file out (``--labelled`` rounds too).
- :mod:`.choices`     the strategies' names and what each picks, without numpy (``sslkit-select --help``).

Each strategy's module says what follows its paper and what follows its official code. Every strategy
compares images by the Euclidean distance between their L2-normalised features,
``||x - y||^2 = 2 - 2 x . y``, computed a block of rows at a time by :mod:`sslkit.evaluation.search`
(60,000 images never need the 60,000 x 60,000 matrix, 14 GB, in memory), and clusters them with
:mod:`sslkit.evaluation.clustering`'s scikit-learn k-means.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from sslkit.selection.choices import STRATEGIES

if TYPE_CHECKING:
    from sslkit.selection.strategies import Selection, choose, select

# The strategies come on first use (PEP 562), not with the package: sslkit-select's --help reads
# sslkit.selection.choices without importing numpy. Ten lines, where lazy_loader would be a dependency.
_EXPORTED_FROM = {"strategies": ("Selection", "choose", "select")}

__all__ = ["STRATEGIES", "Selection", "choose", "select"]


def __getattr__(name: str):
    module = next((module for module, names in _EXPORTED_FROM.items() if name in names), None)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
