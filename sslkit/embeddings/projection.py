"""Embeddings in two dimensions, for a map of the whole set: PCA, t-SNE or UMAP.

PCA and t-SNE are scikit-learn's (a dependency already); UMAP (McInnes et al. 2018) is
``umap-learn``'s when it is installed. t-SNE and UMAP keep neighbourhoods and lose global
distances; PCA keeps the two directions of largest variance and is exact and fast. Rows are
L2-normalised first, as every other embeddings command compares them by cosine.

>>> project_2d(np.random.default_rng(0).standard_normal((50, 8)), "pca").shape
(50, 2)
"""

from __future__ import annotations

import importlib.util

import numpy as np

from sslkit.embeddings.choices import MAP_METHODS
from sslkit.errors import UserError, install_hint


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def project_2d(vectors: np.ndarray, method: str = "pca", seed: int = 0) -> np.ndarray:
    """Two coordinates per row of ``vectors``, by ``method`` (one of :data:`MAP_METHODS`).

    Shape:
        vectors: (N, D); returns (N, 2) float32.
    """
    if method not in MAP_METHODS:
        raise UserError(f"unknown map method '{method}'; choose one of: {', '.join(MAP_METHODS)}")
    if len(vectors) < 3:
        raise UserError(f"a map needs at least 3 embeddings, got {len(vectors)}")
    unit = _unit_rows(vectors)
    if method == "pca":
        from sklearn.decomposition import PCA

        return PCA(n_components=2, random_state=seed).fit_transform(unit).astype(np.float32)
    if method == "tsne":
        from sklearn.manifold import TSNE

        # perplexity must stay below the number of points; 30 is scikit-learn's default.
        perplexity = min(30.0, (len(unit) - 1) / 3)
        tsne = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed, metric="cosine")
        return tsne.fit_transform(unit).astype(np.float32)
    if importlib.util.find_spec("umap") is None:
        raise UserError(f"the umap map needs umap-learn: {install_hint('umap')}; or use --method pca or tsne")
    import umap

    # n_jobs=1: a fixed random_state makes UMAP single-threaded anyway, and it warns unless told so.
    neighbours = min(15, len(unit) - 1)
    reducer = umap.UMAP(n_components=2, n_neighbors=neighbours, metric="cosine", random_state=seed, n_jobs=1)
    return reducer.fit_transform(unit).astype(np.float32)
