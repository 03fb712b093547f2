"""Small helpers every loss shares: argument checks and fp32 math under autocast.

Why fp32: ``exp(1/T)`` overflows fp16 once T < 0.09, and a (2N, 2N) softmax summed in bf16
loses most of its digits. Losses therefore upcast half-precision embeddings to fp32 and run
with autocast disabled (autocast would otherwise cast the matmul back to half). float64
input stays float64, so the tests can compare against loops in double precision.
"""

from __future__ import annotations

import contextlib

import torch


def upcast(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32; fp32 and fp64 unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def full_precision(device: torch.device) -> contextlib.AbstractContextManager:
    """Context in which autocast is off, so the loss's matmuls run in the inputs' dtype."""
    return torch.autocast(device_type=device.type, enabled=False)


def check_positive(value: float, name: str) -> float:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a finite number > 0."""
    value = float(value)
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def check_in_range(value: float, name: str, low: float, high: float) -> float:
    """Raise ``ValueError`` naming ``name`` unless ``low <= value <= high``."""
    value = float(value)
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def check_two_views(z1: torch.Tensor, z2: torch.Tensor) -> None:
    """Two views must both be (N, D) with the same N and D, N >= 1, floating point."""
    if z1.dim() != 2 or z2.dim() != 2:
        raise ValueError(
            f"z1 and z2 must be 2-D (N, D) embeddings, got shapes {tuple(z1.shape)} and {tuple(z2.shape)}"
        )
    if z1.shape != z2.shape:
        raise ValueError(
            f"z1 and z2 must have the same shape (two views of the same N samples), "
            f"got {tuple(z1.shape)} and {tuple(z2.shape)}"
        )
    if z1.shape[0] < 1:
        raise ValueError("z1 and z2 must hold at least one sample")
    if not z1.is_floating_point() or not z2.is_floating_point():
        raise ValueError(f"z1 and z2 must be floating point, got {z1.dtype} and {z2.dtype}")


def check_negatives(negatives: torch.Tensor | None, dim: int) -> None:
    """An optional bank of negatives must be (K, D) with the embeddings' D."""
    if negatives is None:
        return
    if negatives.dim() != 2 or negatives.shape[1] != dim:
        raise ValueError(f"negatives must be (K, {dim}), got shape {tuple(negatives.shape)}")


def check_embeddings_labels(embeddings: torch.Tensor, labels: torch.Tensor | None) -> None:
    """Label losses need (N, D) floating embeddings and (N,) integer labels."""
    if labels is None:
        raise ValueError("labels are required: this loss compares samples by class, pass labels of shape (N,)")
    if embeddings.dim() != 2 or not embeddings.is_floating_point():
        raise ValueError(
            f"embeddings must be floating point (N, D), got shape {tuple(embeddings.shape)} and {embeddings.dtype}"
        )
    if labels.dim() != 1 or labels.shape[0] != embeddings.shape[0]:
        raise ValueError(
            f"labels must be (N,) with N = {embeddings.shape[0]} to match embeddings, got shape {tuple(labels.shape)}"
        )
    if labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"labels must be integer class ids, got {labels.dtype}")
