"""The training loop: the run (:mod:`~sslkit.loop.run`), its builders, one training step, its state and
schedule, its logs, trackers and checkpoints.

``sslkit.loop.train(cfg)`` pretrains an encoder as a recipe says; ``tools/bench/`` builds its pieces with
the same builders (:mod:`sslkit.loop.build`) and times the same :class:`~sslkit.loop.step.TrainingStep`.

The names below are imported on first use (PEP 562): the builders import torchvision, kornia and the
methods, which a process that only starts the training processes (:mod:`sslkit.loop.launch`, under
``accelerate launch --cpu``) or reads a run directory never needs: about 1.5 CPU-seconds of start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sslkit.loop.build import make_run_dir
    from sslkit.loop.run import Run, train

__all__ = ["Run", "make_run_dir", "train"]
_HOMES = {"Run": "sslkit.loop.run", "train": "sslkit.loop.run", "make_run_dir": "sslkit.loop.build"}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'sslkit.loop' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
