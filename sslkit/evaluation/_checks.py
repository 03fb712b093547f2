"""Input checks shared by the evaluators: one ``ValueError`` naming the argument, as the losses do.

A kNN, a probe or a retrieval run on features with a NaN, or on float or out-of-range labels,
would otherwise return a number (labels truncated, a class never matched) or fail deep inside
scikit-learn; these checks make every evaluator refuse the same inputs the same way.
"""

from __future__ import annotations

import torch


def check_features(features, name: str) -> None:
    """A non-empty 2-D floating tensor with only finite values."""
    if not isinstance(features, torch.Tensor):
        raise ValueError(
            f"{name} must be a torch.Tensor (N, D), got {type(features).__name__}; "
            f"for a NumPy array pass torch.from_numpy(array)"
        )
    if features.ndim != 2 or features.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty (N, D) matrix, got shape {tuple(features.shape)}")
    if not features.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {features.dtype}")
    finite = torch.isfinite(features).all(dim=1)
    if not bool(finite.all()):
        row = int((~finite).nonzero()[0])
        raise ValueError(
            f"{name} has NaN or inf values (first in row {row}): the encoder diverged or the features are broken"
        )


def check_class_ids(labels, name: str, rows: int, num_classes: int | None = None) -> None:
    """(rows,) integer class ids, in ``[0, num_classes)`` when ``num_classes`` is given."""
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape ({rows},), got {type(labels).__name__}")
    if labels.shape != (rows,):
        raise ValueError(f"{name} must have shape ({rows},), got {tuple(labels.shape)}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"{name} must be integer class ids, got {labels.dtype}")
    if num_classes is not None and rows and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"{name} must lie in [0, num_classes={num_classes}), got values in "
            f"[{int(labels.min())}, {int(labels.max())}]"
        )
