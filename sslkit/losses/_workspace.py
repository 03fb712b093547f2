"""Reusable CPU buffers for a loss's large temporaries: its pages stay mapped between steps.

Why by hand. On the CPU, PyTorch allocates with the C library's ``malloc``, and glibc's
``malloc`` hands a freed block of tens of MiB back to the kernel (``munmap``, or a heap trim),
so the same block allocated again next step is fresh memory: one page fault per 4 KiB page
when it is first written. A margin-softmax head at N=512, D=512, C=10,000 allocates two 20 MiB
temporaries per step (the (N, C) logits and the (C, D) weight gradient before its radial
part is removed); reusing the two buffers spares the page faults of their first write in
every step (the weight gradient it returns must be new memory, and still faults its pages).
Accelerators have caching allocators already, so there :meth:`Workspace.take` just allocates
and :meth:`Workspace.give_back` keeps nothing.

The buffers stay allocated between calls (the (N, C) and (C, D) sizes of the last one);
:meth:`Workspace.clear` frees them.

A buffer is *taken* out of the workspace for as long as it is in use and *given back* when
its last reader is done. A buffer that is never given back (a forward whose backward never
runs) is freed with its graph as any tensor would be, and the next ``take`` allocates a new
one; two calls in flight at once get two buffers. Nothing can be read after it was reused.
"""

from __future__ import annotations

import torch


class Workspace:
    """A few named scratch tensors, reused across calls on the CPU.

    >>> ws = Workspace()
    >>> a = ws.take("logits", (4, 3), torch.float32, torch.device("cpu"))
    >>> ws.give_back("logits", a)
    >>> ws.take("logits", (4, 3), torch.float32, torch.device("cpu")) is a
    True
    """

    def __init__(self) -> None:
        self._free: dict[str, torch.Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised tensor of this shape, dtype and device, now the caller's alone."""
        buffer = self._free.pop(name, None)
        if buffer is not None and buffer.shape == shape and buffer.dtype == dtype and buffer.device == device:
            return buffer
        return torch.empty(shape, dtype=dtype, device=device)

    def give_back(self, name: str, buffer: torch.Tensor) -> None:
        """Keep ``buffer`` for the next :meth:`take` of ``name``: the caller must not read it again.

        A tensor made under ``torch.inference_mode`` is not kept: outside that mode no op may
        write into it, and the next call may well be a training step.
        """
        if buffer.device.type == "cpu" and not buffer.is_inference():
            self._free[name] = buffer

    def clear(self) -> None:
        """Free every kept buffer (they are also freed with the workspace)."""
        self._free.clear()

    def __getstate__(self) -> dict:
        return {"_free": {}}  # copies and pickles of a head do not carry scratch memory

    def __deepcopy__(self, memo: dict) -> "Workspace":
        return Workspace()
