"""Evaluation of frozen encoders on cached features: weighted kNN, linear probe, retrieval.

One module per idea: :mod:`.features` runs the encoder once (every sample exactly once, across
processes too), and the rest work on the features it returns.
"""

from sslkit.evaluation.knn import knn_accuracy, weighted_knn_predict

__all__ = ["knn_accuracy", "weighted_knn_predict"]
