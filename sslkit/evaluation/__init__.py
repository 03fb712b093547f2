"""Evaluation of frozen encoders on cached features: weighted kNN, linear probe, retrieval.

One module per idea: :mod:`.features` runs the encoder once (every sample exactly once, across
processes too), :mod:`.knn`, :mod:`.linear` and :mod:`.retrieval` work on the features it
returns, :mod:`.splits` builds a run's datasets (held-out classes included) and
:mod:`.protocol` evaluates a run's encoder on them, for the trainer and ``sslkit-evaluate`` alike.
"""

from sslkit.evaluation.features import extract_features
from sslkit.evaluation.knn import knn_accuracy, weighted_knn_predict
from sslkit.evaluation.linear import linear_probe
from sslkit.evaluation.protocol import RunEvaluator, eval_loader
from sslkit.evaluation.retrieval import retrieval_metrics
from sslkit.evaluation.splits import Splits, build_splits

__all__ = [
    "RunEvaluator",
    "Splits",
    "build_splits",
    "eval_loader",
    "extract_features",
    "knn_accuracy",
    "linear_probe",
    "retrieval_metrics",
    "weighted_knn_predict",
]
