"""Methods: how a batch of augmented views (and maybe labels) becomes a loss.

A method is an ``nn.Module`` holding everything that trains — backbone, projection head,
and the loss (with any parameters of its own, such as a classification head) — so one
``accelerator.prepare(method)`` and one optimizer cover every parameter.

Interface: ``method(view1, view2, labels) -> loss``; ``method.backbone`` is the encoder to
evaluate and export; ``method.needs_labels`` says whether the dataset must be labelled;
``Method.loss_names`` lists the registry losses it trains with (checked by :func:`check_loss`
when a recipe is loaded); ``Method.min_batch_size`` (optional, default 1) is 2 for the methods
whose negatives are the other images of the batch (checked by :func:`check_batch_size`);
``Method.options`` (optional, default none) names the ``method.*`` keys it reads, so that a key
set for another method is noted when training starts (:func:`unused_options`); ``Method.notes(cfg, num_samples)``
(optional) returns notes on settings that run but defeat the method on this dataset (:func:`notes`);
``Method.from_config(cfg, backbone, num_classes)`` builds it from a recipe. Optional:
``method.after_optimizer_step(step, total_steps)``, called by the trainer after every optimizer
step (``step`` counts the steps before this one), for state the optimizer does not own — MoCo's
momentum encoder and queue.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from sslkit import losses
from sslkit.errors import UserError
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


# What each method's loss is called with, in words, for the error below.
_LOSS_FORMS = {"two_view": "a two-view loss", "label": "a label loss", "head": "a head"}


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
        needs = f"needs {_LOSS_FORMS[kinds.pop()]}, got loss.name '{loss_name}'; choose one of: {', '.join(sorted(accepted))}"
    else:
        needs = f"trains with loss.name {' or '.join(accepted)}, got '{loss_name}'"
    raise UserError(f"{source}: method '{method_name}' {needs}{hint}")


def build_method(cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> nn.Module:
    """The method named by ``cfg.method.name`` around ``backbone``, with ``cfg.loss``.

    Methods with ``needs_indices`` keep per-sample state and also get the training set's size.
    """
    check_loss(cfg.method.name, cfg.loss.name)
    method = METHODS[cfg.method.name]
    if getattr(method, "needs_indices", False):
        return method.from_config(cfg, backbone, num_classes, num_samples=num_samples)
    return method.from_config(cfg, backbone, num_classes)


__all__ = ["METHODS", "build_method", "check_loss", "SimCLR", "SupCon", "Supervised"]


def check_batch_size(method_name: str, batch_size: int, source: str = "recipe") -> None:
    """Raise one line when the global batch is too small for the method to have anything to contrast.

    SimCLR, MoCo v3 and SupCon take their negatives from the batch itself: with one image the
    softmax runs over its positive alone, the loss is exactly 0 and nothing trains, silently.
    MoCo (queue), NCE (memory bank) and the supervised heads train on a batch of one.
    """
    needed = getattr(METHODS[method_name], "min_batch_size", 1)
    if batch_size < needed:
        raise UserError(
            f"{source}: method '{method_name}' contrasts each image with the other images of its batch; "
            f"train.batch_size={batch_size} leaves none (the loss would be exactly 0): use train.batch_size >= {needed}"
        )


def unused_options(cfg) -> str:
    """A note naming the ``method.*`` settings the chosen method does not read, "" when there are none.

    The method section holds every method's options (``queue_size`` is MoCo's, ``num_negatives``
    NCE's), so a key set for another method (or a recipe for one method run as another) would
    otherwise be ignored silently. A saved ``config.yaml`` lists every key, so a key counts only
    when its value differs from the default: a default has no effect under any method.
    """
    defaults = type(cfg.method)()
    used = set(getattr(METHODS[cfg.method.name], "options", ()))
    unused = [
        f.name
        for f in dataclasses.fields(cfg.method)
        if f.name != "name" and f.name not in used and getattr(cfg.method, f.name) != getattr(defaults, f.name)
    ]
    if not unused:
        return ""
    owners = lambda key: (
        " or ".join(name for name, method in METHODS.items() if key in getattr(method, "options", ())) or "no method"
    )
    listed = ", ".join(f"method.{key}={getattr(cfg.method, key)} (read by {owners(key)})" for key in unused)
    return f"method '{cfg.method.name}' does not read {listed}; {'it has' if len(unused) == 1 else 'they have'} no effect on this run"


def notes(cfg, num_samples: int) -> list[str]:
    """The chosen method's notes on its settings for a training set of ``num_samples`` images (``Method.notes``)."""
    method = METHODS[cfg.method.name]
    return method.notes(cfg, num_samples) if hasattr(method, "notes") else []
