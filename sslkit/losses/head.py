"""The interface every classification head (its own class weights) shares.

A head owns parameters (class weights, proxies), so unlike the pair losses it is called with
``(embeddings, labels)`` and must also give a trainer:

* ``head.logits(embeddings) -> (N, C)``: inference scores with no margin, for accuracy/eval;
* ``head.param_groups() -> list[dict]``: ``{"params": [...], "lr_scale": float, "name": str}``
  so the trainer builds one optimizer group per entry (Proxy-Anchor trains its proxies at
  100x the backbone's learning rate, so the scale cannot be a trainer-wide constant);
* ``head.num_classes``.

The weights are ordinary parameters: under DDP they are averaged like the backbone's, so no
head needs a cross-process gather. The exception is a head built with ``partial_fc=True``
(:mod:`sslkit.losses.partial_fc`): each process then holds a block of the class rows, named in
``sharded_parameters`` so that DDP leaves them alone, and its ``state_dict`` still holds the
whole (C, D) matrix in class order.
"""

from __future__ import annotations

import torch
from torch import nn

from sslkit.losses._common import as_number, check_embeddings, check_embeddings_labels, check_tensor


def check_positive_int(value: int, name: str, minimum: int = 1) -> int:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or as_number(value, name, int) != value or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_class_labels(labels: torch.Tensor, num_classes: int) -> None:
    """Raise ``ValueError`` naming ``labels`` unless every label is in ``[0, num_classes)``.

    Without this, an out-of-range label reaches ``cross_entropy``/``gather`` and fails with an
    index error far from the cause (or, on CUDA, a device-side assert).
    """
    if not labels.numel():
        return
    low, high = torch.stack([labels.min(), labels.max()]).tolist()  # one host sync, not two
    if low < 0 or high >= num_classes:
        raise ValueError(f"labels must be in [0, num_classes) = [0, {num_classes}), got min {low} and max {high}")


def check_not_empty(embeddings: torch.Tensor) -> None:
    """A head's loss is a mean over the batch: no samples, no loss (and aten's fused row
    normalisation would divide by zero)."""
    if embeddings.shape[0] == 0:
        raise ValueError("embeddings must hold at least one sample: the mean loss over an empty batch is undefined")


_NO_LABELS = object()  # check_inputs' default: the logits() call, which takes no labels
# The state_dict key of a Partial FC head's sampling state (its seed and the loss calls so far).
PARTIAL_FC_SAMPLING = "partial_fc_sampling"


def check_proxy_inputs(embeddings: torch.Tensor, labels: torch.Tensor, proxies: torch.Tensor) -> torch.Tensor:
    """The checks of a head's loss call for the functional proxy losses, which take the (C, D)
    proxies as an argument: (N, D) embeddings with N >= 1, (N,) labels in [0, C), proxies with
    the embeddings' D. Returns the labels as int64."""
    check_embeddings_labels(embeddings, labels)
    check_tensor(proxies, "proxies")
    if proxies.dim() != 2 or proxies.shape[1] != embeddings.shape[1]:
        raise ValueError(f"proxies must be (C, {embeddings.shape[1]}), got shape {tuple(proxies.shape)}")
    check_class_labels(labels, proxies.shape[0])
    check_not_empty(embeddings)
    return labels.long()


class Head(nn.Module):
    """Base of every classification head: sizes, label checks, optimizer groups.

    Subclasses implement ``forward(embeddings, labels=None) -> scalar loss`` and
    ``logits(embeddings) -> (N, C)``, and call :meth:`check_inputs` first in both. ``labels``
    defaults to None so that ``head(embeddings)`` reaches the check's ValueError ("labels are
    required"), not Python's TypeError about a missing positional argument.

    Args:
        embedding_dim: D, the size of each embedding.
        num_classes: C, the number of training classes.
    """

    # Partial FC: this process's block of the class rows, and the names of the (rows, D)
    # parameters sharded so (each process holds other rows: DDP must neither average nor
    # broadcast them). None and () for a head that holds every class.
    partial_fc: nn.Module | None = None  # a sslkit.losses.partial_fc.PartialFC
    sharded_parameters: tuple[str, ...] = ()

    def __init__(self, embedding_dim: int, num_classes: int) -> None:
        super().__init__()
        self.embedding_dim = check_positive_int(embedding_dim, "embedding_dim")
        self.num_classes = check_positive_int(num_classes, "num_classes")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        # A sharded parameter is saved whole, in class order: every process must call state_dict().
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in self.sharded_parameters:
            destination[prefix + name] = self.partial_fc.gather_rows(destination[prefix + name])
        if self.partial_fc is not None:  # where the sampling of negative centres has got to: exact resume
            destination[prefix + PARTIAL_FC_SAMPLING] = self.partial_fc.sampling_state()

    def _load_from_state_dict(self, state_dict, prefix, *args):
        # The whole (C, D) matrix in class order: this process takes its rows (another shape is
        # left for the shape check to report).
        state_dict = dict(state_dict)
        for key in (prefix + name for name in self.sharded_parameters):
            if key in state_dict and state_dict[key].dim() and state_dict[key].shape[0] == self.num_classes:
                state_dict[key] = self.partial_fc.own_rows(state_dict[key])
        # Taken by a Partial FC head, dropped by a full one (a run may switch partial_fc when it resumes).
        sampling = state_dict.pop(prefix + PARTIAL_FC_SAMPLING, None)
        if sampling is not None and self.partial_fc is not None:
            self.partial_fc.load_sampling_state(sampling)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def check_inputs(
        self, embeddings: torch.Tensor, labels: torch.Tensor | None | object = _NO_LABELS
    ) -> torch.Tensor | None:
        """(N, D) floating embeddings with this head's D and, in a loss call, (N,) labels in [0, C).

        ``logits()`` leaves ``labels`` out; a loss call passes what it was given, so that
        ``head(embeddings, None)`` is a ValueError saying labels are required, not a crash later.
        Returns the labels as int64 (any integer or bool dtype is accepted; ``gather``,
        ``cross_entropy`` and indexing want int64, and uint8 would index as a mask), or None.
        """
        if labels is _NO_LABELS:
            check_embeddings(embeddings)
        else:
            check_embeddings_labels(embeddings, labels)
            check_class_labels(labels, self.num_classes)
            check_not_empty(embeddings)
        if embeddings.shape[1] != self.embedding_dim:
            raise ValueError(
                f"embeddings must have embedding_dim = {self.embedding_dim} columns, got {embeddings.shape[1]}"
            )
        return None if labels is _NO_LABELS else labels.long()

    def logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (N, C) inference scores (no margin)."""
        raise NotImplementedError

    def param_groups(self) -> list[dict]:
        """One optimizer group per entry; by default every parameter at the trainer's learning rate."""
        return [{"params": list(self.parameters()), "lr_scale": 1.0, "name": type(self).__name__}]
