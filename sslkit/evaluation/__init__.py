"""Evaluation of frozen encoders on cached features: weighted kNN, linear probe, retrieval.

One module per idea: :mod:`.features` runs the encoder once (every sample exactly once, across
processes too), and the rest work on the features it returns.
"""

from sslkit.evaluation.features import extract_features
from sslkit.evaluation.knn import knn_accuracy, weighted_knn_predict
from sslkit.evaluation.linear import linear_probe
from sslkit.evaluation.retrieval import retrieval_metrics

__all__ = ["extract_features", "knn_accuracy", "linear_probe", "retrieval_metrics", "weighted_knn_predict"]
