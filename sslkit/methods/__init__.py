"""Methods: how a batch of augmented views (and maybe labels) becomes a loss.

Every method subclasses :class:`~sslkit.methods.base.Method`, whose docstring is the interface
(what the trainer calls and the attributes it reads, with their defaults), and is registered
by name in :data:`METHODS`. To add one, see ``docs/add-a-method.md``.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from sslkit import losses
from sslkit.errors import UserError
from sslkit.methods.base import Method
from sslkit.methods.distill import Distill
from sslkit.methods.finetune import FineTune
from sslkit.methods.moco import MoCo, MoCoV3
from sslkit.methods.nce import MemoryBankNCE
from sslkit.methods.simclr import SimCLR
from sslkit.methods.supcon import SupCon
from sslkit.methods.supervised import Supervised

METHODS: dict[str, type[Method]] = {
    "simclr": SimCLR,
    "supcon": SupCon,
    "supervised": Supervised,
    "moco": MoCo,
    "mocov3": MoCoV3,
    "nce": MemoryBankNCE,
    "finetune": FineTune,
    "distill": Distill,
}


# What each method's loss is called with, in words, for the error below.
_LOSS_FORMS = {
    "two_view": "a two-view loss",
    "query_key": "a query-key loss",
    "label": "a label loss",
    "head": "a head",
}


def check_loss(method_name: str, loss_name: str, source: str = "recipe") -> None:
    """Raise one line unless ``loss_name`` is a loss the method trains with (``Method.loss_names``).

    The line names the losses the method takes and, when another method takes this loss, that
    method: ``loss.name=supcon`` under ``method.name=supervised`` points to ``method.name=supcon``.
    """
    accepted = METHODS[method_name].loss_names
    if loss_name in accepted:
        return
    kinds = {losses.KIND[name] for name in accepted}
    others = [name for name, method in METHODS.items() if loss_name in method.loss_names]
    hint = f"; loss.name '{loss_name}' trains with method.name={' or '.join(others)}" if others else ""
    if len(kinds) == 1 and len(accepted) > 2:  # a whole family: say which, and list it
        choices = ", ".join(sorted(accepted))
        needs = f"needs {_LOSS_FORMS[kinds.pop()]}, got loss.name '{loss_name}'; choose one of: {choices}"
    else:
        needs = f"trains with loss.name {' or '.join(accepted)}, got '{loss_name}'"
    raise UserError(f"{source}: method '{method_name}' {needs}{hint}")


def build_method(cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> Method:
    """The method named by ``cfg.method.name`` around ``backbone``, with ``cfg.loss``.

    ``num_samples``, the training set's size, is for methods that keep per-sample state
    (``needs_indices``); the others ignore it.
    """
    check_loss(cfg.method.name, cfg.loss.name)
    return METHODS[cfg.method.name].from_config(cfg, backbone, num_classes, num_samples=num_samples)


def check_batch_size(method_name: str, batch_size: int, source: str = "recipe") -> None:
    """Raise one line when the global batch is too small for the method to have anything to contrast.

    SimCLR, MoCo v3 and SupCon take their negatives from the batch itself: with one image the
    softmax runs over its positive alone, the loss is exactly 0 and nothing trains, silently.
    MoCo (queue), NCE (memory bank) and the supervised heads train on a batch of one.
    """
    needed = METHODS[method_name].min_batch_size
    if batch_size < needed:
        raise UserError(
            f"{source}: method '{method_name}' contrasts each image with the other images of its batch; "
            f"train.batch_size={batch_size} leaves none (the loss would be exactly 0): "
            f"use train.batch_size >= {needed}"
        )


def unused_options(cfg) -> str:
    """A note naming the ``method.*`` settings the chosen method does not read, "" when there are none.

    The method section holds every method's options (``queue_size`` is MoCo's, ``num_negatives``
    NCE's), so a key set for another method (or a recipe for one method run as another) would
    otherwise be ignored silently. A saved ``config.yaml`` lists every key, so a key counts only
    when its value differs from the default: a default has no effect under any method.
    """
    defaults = type(cfg.method)()
    used = set(METHODS[cfg.method.name].options)
    unused = [
        f.name
        for f in dataclasses.fields(cfg.method)
        if f.name != "name" and f.name not in used and getattr(cfg.method, f.name) != getattr(defaults, f.name)
    ]
    if not unused:
        return ""

    def owners(key: str) -> str:
        return " or ".join(name for name, method in METHODS.items() if key in method.options) or "no method"

    listed = ", ".join(f"method.{key}={getattr(cfg.method, key)} (read by {owners(key)})" for key in unused)
    effect = "it has" if len(unused) == 1 else "they have"
    return f"method '{cfg.method.name}' does not read {listed}; {effect} no effect on this run"


def notes(cfg, num_samples: int) -> list[str]:
    """The chosen method's notes on its settings for a training set of ``num_samples`` images (``Method.notes``)."""
    return METHODS[cfg.method.name].notes(cfg, num_samples)


__all__ = [
    "METHODS",
    "Method",
    "build_method",
    "check_loss",
    "check_batch_size",
    "unused_options",
    "notes",
    "SimCLR",
    "SupCon",
    "Supervised",
    "MoCo",
    "MoCoV3",
    "MemoryBankNCE",
]
