"""Cross-batch memory (XBM): the embeddings and labels of earlier batches as extra references.

References:
    [0] Cross-Batch Memory for Embedding Learning, Wang, Zhang, Huang, Scott 2020,
        https://arxiv.org/abs/1912.06798 (official code
        https://github.com/MalongTech/research-xbm, ``ret_benchmark/engine/trainer.py``)
    [1] pytorch-metric-learning ``CrossBatchMemory``; its distributed form keeps a different queue on
        each process (pytorch-metric-learning#639)

Embeddings drift slowly during training (the "slow drift" of [0]), so those of the last few thousand
samples are still valid references for the current batch: a pair loss compares each anchor
with the memory as well as with the batch. The order of one step is that of the official
code: the batch is enqueued first (the oldest entries dropped), then the loss is::

    loss = loss(batch, batch) + loss(batch, memory)

the memory detached (no gradient reaches past batches), an anchor not paired with its own
copy in the memory, the weight of the memory term 1 (the code's ``XBM.WEIGHT`` default). The
memory term alone is pytorch-metric-learning's ``CrossBatchMemory`` loss, which the tests
compare with.

Across processes every process enqueues the batches of all processes, in rank order, so every
process holds the same memory (pytorch-metric-learning's keeps one per process, #639); being
equal everywhere, its buffers are ``replicated_buffers`` that DDP need not re-send. The memory
is in buffers, so a checkpoint saves it and a resumed run continues with it.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from sslkit import distributed
from sslkit.losses._common import References, batch_references


def check_memory_size(memory_size) -> int:
    """``memory_size`` as an int >= 0 (0: no memory), or a ValueError naming it."""
    if isinstance(memory_size, bool) or not isinstance(memory_size, numbers.Integral) or memory_size < 0:
        raise ValueError(f"memory_size must be an integer >= 0 (0: no cross-batch memory), got {memory_size!r}")
    return int(memory_size)


def memory_of(memory_size) -> CrossBatchMemory | None:
    """A pair loss's ``memory_size`` argument, checked: a :class:`CrossBatchMemory` of that many samples, or None
    for 0 (the batch only)."""
    size = check_memory_size(memory_size)
    return CrossBatchMemory(size) if size else None


class CrossBatchMemory(nn.Module):
    """A first-in first-out memory of the ``size`` most recent embeddings and their labels.

    The embedding size and dtype are those of the first batch enqueued (a label loss is built
    without knowing D); a checkpoint restores them with the entries.

    Buffers:
        embeddings: (size, D), detached, in the loss's dtype (fp32 for half-precision input).
        labels: (size,) int64.
        ptr: () int64, the row the next entry is written to (the oldest once full).
        filled: () int64, how many rows hold entries.

    >>> memory = CrossBatchMemory(size=4)
    >>> rows = memory.enqueue(torch.randn(3, 2), torch.tensor([0, 1, 0]))
    >>> memory.references(rows, torch.float32).embeddings.shape
    torch.Size([3, 2])
    """

    replicated_buffers = ("embeddings", "labels", "ptr", "filled")

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = check_memory_size(size)
        if self.size < 1:
            raise ValueError(f"memory_size must be >= 1 for a memory, got {size}")
        self.register_buffer("embeddings", torch.zeros(self.size, 0))
        self.register_buffer("labels", torch.zeros(self.size, dtype=torch.long))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def enqueue(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Append every process's batch (rank order), dropping the oldest entries once full.

        A collective: every process calls it with the same number of rows.

        Shape:
            embeddings: (n, D); labels: (n,).
            returns: (n,) int64, the memory row each local sample was written to (-1 when the
            gathered batch is larger than the memory and the sample's row was overwritten).
        """
        n = embeddings.shape[0]
        batch = distributed.gather_no_grad(embeddings.detach())  # (W n, D)
        batch_labels = distributed.gather_no_grad(labels, check=False)
        if self.embeddings.shape[1] != batch.shape[1]:
            if int(self.filled):
                raise ValueError(
                    f"embeddings must be (n, {self.embeddings.shape[1]}) as those in the memory, "
                    f"got shape {tuple(embeddings.shape)}"
                )
            self.embeddings = batch.new_zeros(self.size, batch.shape[1])
        total = batch.shape[0]
        kept = min(total, self.size)  # more rows than room: only the newest survive
        ptr = int(self.ptr)  # one host read per step: the rows are decided on the host
        rows = torch.full((total,), -1, dtype=torch.long, device=batch.device)
        rows[total - kept :] = (ptr + torch.arange(kept, device=batch.device)) % self.size
        self.embeddings[rows[total - kept :]] = batch[total - kept :].to(self.embeddings.dtype)
        self.labels[rows[total - kept :]] = batch_labels[total - kept :].to(torch.long)
        self.ptr.fill_((ptr + kept) % self.size)
        self.filled.clamp_(max=self.size - kept).add_(kept)  # min(filled + kept, size)
        offset = distributed.local_offset(n)
        return rows[offset : offset + n]

    def references(self, self_column: torch.Tensor, dtype: torch.dtype) -> References:
        """The entries held so far as references for the local anchors (rows ``self_column`` are their own copies).

        The anchor rows ``anchor_offset``/``num_anchors`` follow the processes' batches, which
        :meth:`enqueue` has just gathered.
        """
        filled = int(self.filled)
        n = self_column.shape[0]
        return References(
            self.embeddings[:filled].to(dtype),
            self.labels[:filled],
            self_column,
            distributed.local_offset(n),
            distributed.world_size() * n,
        )

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The embedding size is known once a batch was seen: take the checkpoint's, then load as usual.
        stored = state_dict.get(prefix + "embeddings")
        if stored is not None and stored.shape != self.embeddings.shape:
            self.embeddings = torch.zeros_like(stored, device=self.embeddings.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"size={self.size}"


def reference_sets(
    embeddings: torch.Tensor, labels: torch.Tensor, gather_distributed: bool, memory: CrossBatchMemory | None
) -> list[References]:
    """What a pair loss's local anchors are compared with: the batch, then the memory if there is one.

    The batch is enqueued before the memory is read ([0]'s order), so the memory term also
    sees the current batch (detached), each anchor without its own copy.
    """
    references = [batch_references(embeddings, labels, gather_distributed)]
    if memory is not None:
        rows = memory.enqueue(embeddings, labels)
        references.append(memory.references(rows, embeddings.dtype))
    return references
