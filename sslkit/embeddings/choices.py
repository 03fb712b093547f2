"""The names the embeddings commands offer, as plain strings, importable without numpy or torch.

``sslkit-neighbours``, ``sslkit-duplicates`` and ``sslkit-map`` list them in ``--help`` before they
import anything that computes; the modules that act on them check their arguments against the same
tuples.
"""

INDEXES = ("exact", "faiss")  # sslkit.embeddings.neighbours: every pair, or an approximate faiss index
FAISS_TYPES = ("ivf", "hnsw")  # that faiss index: IVF-Flat or HNSW
KEEP_RULES = ("farthest", "nearest", "first")  # sslkit.embeddings.duplicates: the item a group keeps
KMEANS_BACKENDS = ("auto", "faiss", "torch")  # and its k-means
MAP_METHODS = ("pca", "tsne", "umap")  # sslkit.embeddings.projection: how a map places the rows in 2-D
