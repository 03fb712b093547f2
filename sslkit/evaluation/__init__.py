"""Evaluation of frozen encoders on cached features: weighted kNN, linear probe, retrieval.

One module per idea: :mod:`.features` runs the encoder once (every sample exactly once, across
processes too), :mod:`.knn`, :mod:`.linear` and :mod:`.retrieval` work on the features it
returns, and :mod:`.protocol` evaluates a run's encoder on the datasets
:func:`sslkit.datasets.build_splits` builds, for the trainer and ``sslkit-evaluate`` alike.
:mod:`.encoder` loads a trained encoder, and :mod:`.evaluate` is ``sslkit-evaluate`` as a function
(:func:`evaluate_encoder`).
"""

from sslkit.evaluation.evaluate import evaluate_encoder
from sslkit.evaluation.features import extract_features
from sslkit.evaluation.knn import knn_accuracy, weighted_knn_predict
from sslkit.evaluation.linear import linear_probe
from sslkit.evaluation.protocol import RunEvaluator, eval_loader
from sslkit.evaluation.retrieval import retrieval_metrics

__all__ = [
    "RunEvaluator",
    "eval_loader",
    "evaluate_encoder",
    "extract_features",
    "knn_accuracy",
    "linear_probe",
    "retrieval_metrics",
    "weighted_knn_predict",
]
