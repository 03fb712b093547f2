"""Methods: how a batch of augmented views (and maybe labels) becomes a loss.

Every method subclasses :class:`~sslkit.methods.base.Method`, whose docstring is the interface
(what the trainer calls and the attributes it reads, with their defaults), declares its
``method.*`` options and checks them itself, and is registered by name in :data:`METHODS`.
To add one, see ``docs/add-a-method.md``.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

from torch import nn

from sslkit import losses, models
from sslkit.errors import UserError
from sslkit.methods.barlow_twins import BarlowTwins
from sslkit.methods.base import Method
from sslkit.methods.byol import BYOL
from sslkit.methods.dino import DINO
from sslkit.methods.distill import Distill
from sslkit.methods.finetune import FineTune
from sslkit.methods.fixmatch import FixMatch
from sslkit.methods.moco import MoCo, MoCoV3
from sslkit.methods.nce import MemoryBankNCE
from sslkit.methods.simclr import SimCLR
from sslkit.methods.simsiam import SimSiam
from sslkit.methods.supcon import SupCon
from sslkit.methods.supervised import Supervised
from sslkit.methods.vicreg import VICReg
from sslkit.models import weights
from sslkit.schema import coerce, parse_config, read_yaml

METHODS: dict[str, type[Method]] = {
    "simclr": SimCLR,
    "supcon": SupCon,
    "supervised": Supervised,
    "moco": MoCo,
    "mocov3": MoCoV3,
    "byol": BYOL,
    "simsiam": SimSiam,
    "barlow_twins": BarlowTwins,
    "vicreg": VICReg,
    "dino": DINO,
    "nce": MemoryBankNCE,
    "finetune": FineTune,
    "distill": Distill,
    "fixmatch": FixMatch,
}


# What each method's loss is called with, in words, for the error below.
_LOSS_FORMS = {
    "two_view": "a two-view loss",
    "batch_statistics": "a loss over batch statistics",
    "query_key": "a query-key loss",
    "student_teacher": "a student-teacher loss",
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


def option_fields() -> dict[str, dataclasses.Field]:
    """``{key: field}`` of every ``method.*`` option of every registered method, in registry order.

    A key that several methods read (``momentum``: MoCo, MoCo v3 and BYOL) appears once, with the
    field of the first; their types agree, their defaults may not (BYOL's ``momentum`` is 0.996,
    MoCo's 0.99): :func:`check_config` fills a method's unset options with its own defaults.
    """
    fields: dict[str, dataclasses.Field] = {}
    for method in METHODS.values():
        for item in dataclasses.fields(method.Options):
            fields.setdefault(item.name, item)
    return fields


def check_config(cfg, source: str = "recipe") -> None:
    """The recipe's ``method`` section and what the method needs of the rest of the recipe, one line each.

    ``method.name`` must be registered; every other ``method.*`` key must be an option of some
    method, of the type its options dataclass declares (a key only another method reads is kept:
    :func:`unused_options` notes it when training starts); the loss and batch must suit the
    method; then the method's own :meth:`~sslkit.methods.base.Method.check_config`.

    Unset options take their defaults here, the method's own first, so the saved ``config.yaml``
    lists every option of every method, as a resumed run compares it (``method.*`` must not change).
    """
    name = cfg.method.name
    if name not in METHODS:
        raise UserError(f"{source}: unknown method.name '{name}'; choose one of: {', '.join(sorted(METHODS))}")
    fields = option_fields()
    given = {}
    for key, value in cfg.method.options.items():
        if key not in fields:
            raise UserError(f"{source}: unknown key 'method.{key}'; valid keys in 'method': name, {', '.join(fields)}")
        owner = next(method.Options for method in METHODS.values() if key in _names(method.Options))
        given[key] = coerce(value, typing.get_type_hints(owner)[key], f"method.{key}", source)
    method = METHODS[name]
    defaults = {key: item.default for key, item in fields.items()}
    cfg.method.options = {**defaults, **dataclasses.asdict(method.Options()), **given}
    check_loss(name, cfg.loss.name, source)
    check_batch_size(name, cfg.train.batch_size, source)
    if cfg.augment.local_views and not method.takes_local_views:
        takers = ", ".join(key for key, other in METHODS.items() if other.takes_local_views)
        raise UserError(
            f"{source}: method '{name}' trains on its global views only, got augment.local_views="
            f"{cfg.augment.local_views}; set augment.local_views=0, or use a method with multi-crop: {takers}"
        )
    method.check_config(cfg, source)


def _names(options: type) -> set[str]:
    return {item.name for item in dataclasses.fields(options)}


def build_method(cfg, backbone: nn.Module, num_classes: int, num_samples: int | None = None) -> Method:
    """The method named by ``cfg.method.name`` around ``backbone``, with ``cfg.loss``.

    ``num_samples``, the training set's size, is for methods that keep per-sample state
    (``needs_indices``); the others ignore it. A method that ``needs_teacher`` gets the run
    ``method.teacher`` names, built by :func:`load_teacher`.
    """
    check_config(cfg)
    method = METHODS[cfg.method.name]
    if method.needs_teacher:
        teacher = load_teacher(cfg.method.options["teacher"], num_classes, backbone.in_channels)
        return method.from_config(cfg, backbone, num_classes, num_samples=num_samples, teacher=teacher)
    return method.from_config(cfg, backbone, num_classes, num_samples=num_samples)


def load_teacher(source: str | None, num_classes: int, in_channels: int) -> Method:
    """The classifier run at ``source`` (a run directory or a checkpoint in one), frozen, in eval mode.

    Built from the run's own ``config.yaml`` (checked against the schema and its method's options;
    the rest was checked when it trained) with its own method, which must have a classifier
    (``classifier_metric``). The path is checked here, when the run starts, not when the recipe
    loads: a sweep plans the student before its teacher exists (``sslkit-label-efficiency``).
    """
    if not source:
        raise UserError(
            "method.name=distill needs method.teacher: the run directory of a fine-tuned run "
            "(method.name=finetune) whose predictions the student learns"
        )
    run_dir = weights.run_directory_of(source) if Path(source).exists() else None
    if run_dir is None:
        raise UserError(
            f"method.teacher '{source}' is not a run directory (no config.yaml); give the run directory of a "
            f"fine-tuned run, e.g. runs/finetune (method.name=finetune)"
        )
    saved = run_dir / "config.yaml"
    cfg = parse_config(read_yaml(saved), str(saved))
    check_config(cfg, str(saved))
    method = METHODS[cfg.method.name]
    if not method.classifier_metric:
        raise UserError(
            f"method.teacher '{source}' was trained with method.name={cfg.method.name}, which has no classifier; "
            f"give a fine-tuned run (method.name=finetune)"
        )
    teacher = build_method(cfg, models.backbone_from_config(cfg.model, in_channels), num_classes)
    try:
        teacher.load_state_dict(weights.load_method_state(source))
    except RuntimeError as error:
        raise UserError(
            f"method.teacher '{source}' does not fit its own recipe for this data ({num_classes} classes, "
            f"{in_channels} channels): {' '.join(str(error).split())[:300]}"
        ) from None
    return teacher.requires_grad_(False).eval()


def check_batch_size(method_name: str, batch_size: int, source: str = "recipe") -> None:
    """Raise one line when the global batch is too small for the method (``Method.min_batch_size``).

    SimCLR, MoCo v3 and SupCon take their negatives from the batch itself: with one image the
    softmax runs over its positive alone, the loss is exactly 0 and nothing trains, silently.
    Barlow Twins and VICReg take per-feature statistics over the batch, and BYOL's and SimSiam's
    predictors normalise by BatchNorm over it, which one image does not have. MoCo (queue), NCE
    (memory bank), DINO (its centre) and the supervised heads train on a batch of one.
    """
    method = METHODS[method_name]
    if batch_size < method.min_batch_size:
        raise UserError(
            f"{source}: method '{method_name}' {method.min_batch_reason}; train.batch_size={batch_size} is too "
            f"small: use train.batch_size >= {method.min_batch_size}"
        )


def unused_options(cfg) -> str:
    """A note naming the ``method.*`` settings the chosen method does not read, "" when there are none.

    A recipe may set an option of another method (``queue_size`` is MoCo's, ``num_negatives``
    NCE's), or be run as another method: the key would otherwise be ignored silently. A key
    counts only when its value differs from its default: a saved ``config.yaml`` lists every
    method's options, and a default has no effect under any method.
    """
    fields, own = option_fields(), _names(METHODS[cfg.method.name].Options)
    unused = [
        key
        for key, value in cfg.method.options.items()
        if key not in own and value != fields[key].default  # options are plain values, without default factories
    ]
    if not unused:
        return ""

    def owners(key: str) -> str:
        return " or ".join(name for name, method in METHODS.items() if key in _names(method.Options))

    listed = ", ".join(f"method.{key}={cfg.method.options[key]} (read by {owners(key)})" for key in unused)
    effect = "it has" if len(unused) == 1 else "they have"
    return f"method '{cfg.method.name}' does not read {listed}; {effect} no effect on this run"


def notes(cfg, num_samples: int) -> list[str]:
    """The chosen method's notes on its settings for a training set of ``num_samples`` images (``Method.notes``)."""
    return METHODS[cfg.method.name].notes(cfg, num_samples)


__all__ = [
    "METHODS",
    "Method",
    "build_method",
    "check_config",
    "check_loss",
    "load_teacher",
    "check_batch_size",
    "option_fields",
    "unused_options",
    "notes",
    "SimCLR",
    "SupCon",
    "Supervised",
    "MoCo",
    "MoCoV3",
    "MemoryBankNCE",
    "BYOL",
    "SimSiam",
    "BarlowTwins",
    "VICReg",
    "DINO",
    "FixMatch",
]
