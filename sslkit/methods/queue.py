"""MoCo's dictionary: a first-in first-out queue of past keys, used as negatives.

References:
    [0] MoCo, He et al. 2020, https://arxiv.org/abs/1911.05722 (section 3.2, "Dictionary as a queue")
"""

from __future__ import annotations

import torch
from torch import nn

from sslkit import distributed


class KeyQueue(nn.Module):
    """A ring buffer of the ``size`` most recent keys, held in buffers.

    Buffers, not plain tensors: the queue is part of the method's ``state_dict``, so a checkpoint
    stores it and a resumed run continues with the same negatives, and ``.to(device)`` moves it.

    Across processes, :meth:`enqueue` gathers the keys of every process (rank order), so every
    process holds the same queue: the negatives of a query are the global past batches, as in
    MoCo's multi-GPU code. Being equal everywhere, the buffers are ``replicated_buffers``: DDP
    need not re-send them from rank 0 each step (see
    :func:`sslkit.distributed.skip_broadcast_of_replicated_buffers`).

    Buffers:
        keys: (size, dim) float32, the ring buffer.
        ptr: () int64, the row the next key is written to (the oldest key once full).
        filled: () int64, how many rows hold keys (``size`` once the queue is full).

    >>> queue = KeyQueue(size=5, dim=2)
    >>> queue.enqueue(torch.ones(3, 2))
    >>> queue.negatives().shape
    torch.Size([3, 2])
    """

    replicated_buffers = ("keys", "ptr", "filled")

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        if size < 1 or dim < 1:
            raise ValueError(f"size and dim must be >= 1, got size={size}, dim={dim}")
        self.size, self.dim = int(size), int(dim)
        self.register_buffer("keys", torch.zeros(self.size, self.dim))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor) -> None:
        """Append the keys of every process (rank order), dropping the oldest once full.

        Every process must call this with the same number of keys (a collective).

        Shape:
            keys: (n, dim) on each process; (world_size * n) keys are appended in all.
        """
        if keys.dim() != 2 or keys.shape[1] != self.dim:
            raise ValueError(f"keys must be (n, {self.dim}), got shape {tuple(keys.shape)}")
        keys = distributed.gather_no_grad(keys.detach()).to(self.keys.dtype)  # (W n, dim)
        keys = keys[-self.size :]  # more keys than room: only the newest survive
        n = keys.shape[0]
        # One host read per call; the queue's rows are decided on the host.
        ptr = int(self.ptr)
        first = min(n, self.size - ptr)  # rows until the end of the buffer
        self.keys[ptr : ptr + first] = keys[:first]
        self.keys[: n - first] = keys[first:]  # wrap around
        self.ptr.fill_((ptr + n) % self.size)
        self.filled.clamp_(max=self.size - n).add_(n)  # min(filled + n, size)

    def negatives(self) -> torch.Tensor:
        """The keys held so far: all ``size`` once full, before that only the rows filled.

        Shape:
            returns: (min(keys enqueued, size), dim), a view of the buffer (treat as read-only).
        """
        return self.keys[: int(self.filled)]

    def extra_repr(self) -> str:
        return f"size={self.size}, dim={self.dim}"
