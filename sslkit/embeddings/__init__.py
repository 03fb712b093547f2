"""What an encoder is for: embeddings of a user's images, nearest neighbours, near-duplicates, and pictures.

- :mod:`sslkit.embeddings.store`       an embeddings folder on disk (``embeddings.npy``, ``items.csv``, ``meta.json``)
- :mod:`sslkit.embeddings.encoders`    the network of a run, checkpoint, backbone file or timm folder, with its input.
- :mod:`sslkit.embeddings.images`      the images to embed: any dataset sslkit reads, one split, in a fixed order.
- :mod:`sslkit.embeddings.writer`      an embeddings folder written in chunks by several processes, and resumed.
- :mod:`sslkit.embeddings.extract`     :func:`embed` (in memory) and :func:`embed_to_folder` (``sslkit-embed``).
- :mod:`sslkit.embeddings.neighbours`  each item's k nearest neighbours: exact and blockwise, or a faiss index.
- :mod:`sslkit.embeddings.duplicates`  near-duplicates within a set (SemDeDup) and near-copies in another set.
- :mod:`sslkit.embeddings.choices`     the names the commands offer (indexes, k-means backends, map methods).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sslkit.embeddings.duplicates import Deduplication, NearCopies, near_copies, semdedup
    from sslkit.embeddings.extract import embed, embed_to_folder
    from sslkit.embeddings.neighbours import nearest_neighbours, recall_at_k
    from sslkit.embeddings.store import Embeddings, read_embeddings, write_embeddings

# What the package exports comes on first use (PEP 562), not with the package: a command's --help reads
# sslkit.embeddings.choices without importing numpy and torch. Ten lines, where lazy_loader would be a dependency.
_EXPORTED_FROM = {
    "duplicates": ("Deduplication", "NearCopies", "near_copies", "semdedup"),
    "extract": ("embed", "embed_to_folder"),
    "neighbours": ("nearest_neighbours", "recall_at_k"),
    "store": ("Embeddings", "read_embeddings", "write_embeddings"),
}

__all__ = [
    "Deduplication",
    "Embeddings",
    "NearCopies",
    "embed",
    "embed_to_folder",
    "near_copies",
    "nearest_neighbours",
    "read_embeddings",
    "recall_at_k",
    "semdedup",
    "write_embeddings",
]


def __getattr__(name: str):
    module = next((module for module, names in _EXPORTED_FROM.items() if name in names), None)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
