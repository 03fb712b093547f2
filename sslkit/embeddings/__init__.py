"""What an encoder is for: embeddings of a user's images, nearest neighbours, near-duplicates, and pictures.

- :mod:`sslkit.embeddings.store`  the embeddings folder on disk (``embeddings.npy``, ``items.csv``, ``meta.json``).
"""

from sslkit.embeddings.store import Embeddings, read_embeddings, write_embeddings

__all__ = ["Embeddings", "read_embeddings", "write_embeddings"]
