"""What an encoder is for: embeddings of a user's images, nearest neighbours, near-duplicates, and pictures.

- :mod:`sslkit.embeddings.store`  the embeddings folder on disk (``embeddings.npy``, ``items.csv``, ``meta.json``).
- :mod:`sslkit.embeddings.neighbours`  each item's k nearest neighbours: exact and blockwise, or a faiss index.
- :mod:`sslkit.embeddings.duplicates`  near-duplicates within a set (SemDeDup) and near-copies in another set.
"""

from sslkit.embeddings.duplicates import Deduplication, NearCopies, near_copies, semdedup
from sslkit.embeddings.neighbours import nearest_neighbours, recall_at_k
from sslkit.embeddings.store import Embeddings, read_embeddings, write_embeddings

__all__ = ["Embeddings", "read_embeddings", "write_embeddings"]
__all__ += ["nearest_neighbours", "recall_at_k"]
__all__ += ["Deduplication", "NearCopies", "near_copies", "semdedup"]
