"""Methods: how a batch of augmented views (and maybe labels) becomes a loss.

A method is an ``nn.Module`` holding everything that trains — backbone, projection head,
and the loss (with any parameters of its own, such as a classification head) — so one
``accelerator.prepare(method)`` and one optimizer cover every parameter.

Interface: ``method(view1, view2, labels) -> loss``; ``method.backbone`` is the encoder to
evaluate and export; ``method.needs_labels`` says whether the dataset must be labelled;
``Method.from_config(cfg, backbone, num_classes)`` builds it from a recipe. Optional:
``method.after_optimizer_step(step, total_steps)``, called by the trainer after every optimizer
step (``step`` counts the steps before this one), for state the optimizer does not own — MoCo's
momentum encoder and queue.
"""

from __future__ import annotations

from torch import nn

from sslkit.methods.moco import MoCo, MoCoV3
from sslkit.methods.nce import MemoryBankNCE
from sslkit.methods.simclr import SimCLR
from sslkit.methods.supcon import SupCon
from sslkit.methods.supervised import Supervised

METHODS: dict[str, type[nn.Module]] = {
    "simclr": SimCLR,
    "supcon": SupCon,
    "supervised": Supervised,
    "moco": MoCo,
    "mocov3": MoCoV3,
    "nce": MemoryBankNCE,
}


def build_method(cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> nn.Module:
    """The method named by ``cfg.method.name`` around ``backbone``, with ``cfg.loss``.

    Methods with ``needs_indices`` keep per-sample state and also get the training set's size.
    """
    method = METHODS[cfg.method.name]
    if getattr(method, "needs_indices", False):
        return method.from_config(cfg, backbone, num_classes, num_samples=num_samples)
    return method.from_config(cfg, backbone, num_classes)


__all__ = ["METHODS", "build_method", "SimCLR", "SupCon", "Supervised"]
