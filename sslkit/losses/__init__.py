"""Every sslkit loss, re-exported flat, and one registry: ``sslkit.losses.build(name, **kwargs)``.

Six call forms (``KIND[name]`` says which):

- ``"two_view"``: ``loss(z1, z2, negatives=None)`` — self-supervised, no labels.
- ``"batch_statistics"``: ``loss(z1, z2)`` — self-supervised, no negatives: a function of the two
  views' feature statistics over the global batch, which needs 2 samples or more.
- ``"query_key"``: ``loss(queries, keys)`` — self-supervised, a predictor's outputs against target
  keys that get no gradient (a momentum encoder's, or stopped), both views stacked in each.
- ``"student_teacher"``: ``loss(student, teacher, epoch)`` — self-distillation with multi-crop: the
  student's outputs for every view, the teacher's (no gradient) for the global views, each stacked
  view by view; ``epoch`` drives the teacher-temperature schedule.
- ``"label"``: ``loss(embeddings, labels)`` — pair-based metric learning.
- ``"head"``: ``head(embeddings, labels)`` with its own weights, ``head.logits(embeddings)``,
  built with ``embedding_dim`` and ``num_classes``; ``head.param_groups()`` names parameters
  that want their own learning rate.

The registry is :data:`BY_KIND`, one plain dict filled here, explicitly (no import side effects);
``LOSSES`` (name -> class) and ``KIND`` (name -> call form) are derived from it. To add a loss,
see ``docs/add-a-loss.md``.
"""

from __future__ import annotations

import inspect

from torch import nn

from sslkit.errors import UserError
from sslkit.losses.adacos import AdaCosHead
from sslkit.losses.adacos_dynamic import AdaCosDynamicHead
from sslkit.losses.angular import AngularLoss
from sslkit.losses.arcface import ArcFaceHead
from sslkit.losses.barlow_twins import BarlowTwinsLoss, barlow_twins_loss
from sslkit.losses.byol import BYOLLoss, byol_loss
from sslkit.losses.circle import CircleLoss
from sslkit.losses.coco import CoCoHead
from sslkit.losses.contrastive import ContrastiveLoss
from sslkit.losses.cosface import CosFaceHead
from sslkit.losses.dcl import DCLLoss, dcl_loss
from sslkit.losses.dclw import DCLWLoss, dclw_loss
from sslkit.losses.dino import DINOLoss, dino_loss, dino_teacher_temperature
from sslkit.losses.lifted import LiftedStructureLoss
from sslkit.losses.lsoftmax import LSoftmaxHead
from sslkit.losses.mocov3 import MoCoV3Loss, mocov3_loss
from sslkit.losses.multi_similarity import MultiSimilarityLoss, multi_similarity_loss
from sslkit.losses.nce import NCELoss, nce_loss
from sslkit.losses.normsoftmax import NormSoftmaxHead
from sslkit.losses.npair import NPairLoss
from sslkit.losses.ntxent import NTXentLoss, ntxent_loss
from sslkit.losses.proxy_anchor import ProxyAnchorHead
from sslkit.losses.proxy_nca import ProxyNCAHead
from sslkit.losses.simsiam import SimSiamLoss, simsiam_loss
from sslkit.losses.soft_nn import SoftNearestNeighborsLoss
from sslkit.losses.softmax import SoftmaxHead
from sslkit.losses.sphereface import SphereFaceHead
from sslkit.losses.supcon import SupConLoss, supcon_loss
from sslkit.losses.triplet import TripletLoss
from sslkit.losses.vicreg import VICRegLoss, vicreg_loss
from sslkit.schema import coerce

# The registry, by call form: the one place a loss is added. LOSSES and KIND are views of it.
BY_KIND: dict[str, dict[str, type[nn.Module]]] = {
    "two_view": {
        "ntxent": NTXentLoss,
        "infonce": NTXentLoss,
        "dcl": DCLLoss,
        "dclw": DCLWLoss,
        "nce": NCELoss,
    },
    "batch_statistics": {
        "barlow_twins": BarlowTwinsLoss,
        "vicreg": VICRegLoss,
    },
    "query_key": {
        "mocov3": MoCoV3Loss,
        "byol": BYOLLoss,
        "simsiam": SimSiamLoss,
    },
    "student_teacher": {
        "dino": DINOLoss,
    },
    "label": {
        "contrastive": ContrastiveLoss,
        "triplet": TripletLoss,
        "lifted": LiftedStructureLoss,
        "lifted_structure": LiftedStructureLoss,
        "npair": NPairLoss,
        "angular": AngularLoss,
        "soft_nn": SoftNearestNeighborsLoss,
        "supcon": SupConLoss,
        "circle": CircleLoss,
        "multi_similarity": MultiSimilarityLoss,
    },
    "head": {
        "proxy_nca": ProxyNCAHead,
        "proxy_anchor": ProxyAnchorHead,
        "softmax": SoftmaxHead,
        "normsoftmax": NormSoftmaxHead,
        "coco": CoCoHead,
        "lsoftmax": LSoftmaxHead,
        "sphereface": SphereFaceHead,
        "cosface": CosFaceHead,
        "amsoftmax": CosFaceHead,
        "arcface": ArcFaceHead,
        "aamsoftmax": ArcFaceHead,
        "adacos": AdaCosHead,
        "adacos_dynamic": AdaCosDynamicHead,
    },
}

LOSSES: dict[str, type[nn.Module]] = {name: cls for table in BY_KIND.values() for name, cls in table.items()}
KIND: dict[str, str] = {name: kind for kind, table in BY_KIND.items() for name in table}


def build(name: str, **kwargs) -> nn.Module:
    """Build a loss by registry name; an unknown name lists the valid ones, an unknown or missing
    argument is a ValueError listing the loss's arguments (not Python's TypeError, which does not).

    >>> build("ntxent", temperature=0.2)
    NTXentLoss(temperature=0.2, gather_distributed=True)
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose one of: {', '.join(sorted(LOSSES))}")
    # Bind first, so that only a wrong argument list becomes this ValueError: a TypeError raised
    # inside a constructor is a bug and keeps its traceback.
    try:
        inspect.signature(LOSSES[name]).bind(**kwargs)
    except TypeError:
        raise ValueError(_argument_error(name, kwargs)) from None
    return LOSSES[name](**kwargs)


# What a missing required argument is, for the error that names it.
_MEANING = {"embedding_dim": "the embedding size D", "num_classes": "the number of classes C"}


def _argument_error(name: str, kwargs: dict) -> str:
    """One line for keyword arguments that do not fit loss ``name``: the unknown ones with every
    valid argument (and its default), else the missing required ones with what they mean."""
    arguments = loss_arguments(name, with_trainer_supplied=True)
    unknown = [key for key in kwargs if key not in arguments]
    if unknown:
        listed = ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in arguments.values())
        plural = "s" if len(unknown) > 1 else ""
        named = _and([repr(key) for key in unknown])
        return f"loss {name!r} takes no argument{plural} {named}; its arguments are: {listed}"
    missing = [key for key, p in arguments.items() if p.default is p.empty and key not in kwargs]
    meanings = [_MEANING[key] for key in missing if key in _MEANING]
    return f"loss {name!r} needs {_and(missing)}" + (f" ({_and(meanings)})" if meanings else "")


def _and(words: list[str]) -> str:
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def loss_arguments(name: str, with_trainer_supplied: bool = False) -> dict[str, inspect.Parameter]:
    """The constructor arguments a recipe may give loss ``name`` (``loss.<argument>``), by name;
    ``with_trainer_supplied=True`` adds those the trainer fills in (every argument ``build`` takes)."""
    signature = inspect.signature(LOSSES[name].__init__)
    # Heads get embedding_dim from the model, not from the recipe; num_classes may be stated
    # there, and is checked against the dataset.
    supplied_by_trainer = set() if with_trainer_supplied else {"embedding_dim"}
    return {
        k: p
        for k, p in signature.parameters.items()
        if k != "self" and k not in supplied_by_trainer and p.kind is p.POSITIONAL_OR_KEYWORD
    }


def _no_partial_fc(name: str) -> str:
    """Why loss ``name`` takes no ``partial_fc``, and which losses do."""
    heads = ", ".join(sorted(n for n in BY_KIND["head"] if "partial_fc" in loss_arguments(n)))
    if KIND[name] == "head":  # SphereFace keeps feature norms; AdaCos' dynamic scale needs every class's logit
        return f"has no Partial FC (it needs unit features and weights and a fixed scale); heads with it: {heads}"
    return f"has no class centres to shard: loss.partial_fc is for the heads of method supervised ({heads})"


def check_loss_kwargs(name: str, kwargs: dict, source: str = "recipe") -> dict:
    """Recipe-time check of a loss's keyword arguments: unknown keys and wrong types are UserErrors.

    Returns the kwargs with ints given for float arguments, and YAML 1.1's string reading of
    ``1e-3``, turned into floats.
    """
    kwargs = dict(kwargs)
    valid = loss_arguments(name)
    for key, value in kwargs.items():
        if key in ("miner", "memory_size") and key not in valid:
            takers = ", ".join(n for n in BY_KIND["label"] if key in loss_arguments(n))
            what = "miner (loss.miner selects pairs)" if key == "miner" else "cross-batch memory (loss.memory_size)"
            raise UserError(f"{source}: loss '{name}' takes no {what}; the pair losses that take one: {takers}")
        if key in ("partial_fc", "sample_rate") and key not in valid:
            raise UserError(f"{source}: loss '{name}' {_no_partial_fc(name)}")
        if key not in valid:
            raise UserError(
                f"{source}: unknown key 'loss.{key}' for loss '{name}'; valid keys: {', '.join(['name', *valid])}"
            )
        default = valid[key].default
        if default is inspect.Parameter.empty or default is None:
            continue
        # Checked against the default's type (every default is a bool, int, float or str); an argument without
        # a default, or with None, is the constructor's to check.
        try:
            kwargs[key] = coerce(value, type(default), f"loss.{key}", source)
        except UserError:  # the same refusal, naming the default: it shows what a value looks like
            raise UserError(
                f"{source}: 'loss.{key}' must be {type(default).__name__} (default {default!r}), got {value!r}"
            ) from None
    try:
        build_for_check = {k: v for k, v in kwargs.items()}
        if KIND[name] == "head":
            build_for_check.update(embedding_dim=2)
            build_for_check.setdefault("num_classes", 3)
        build(name, **build_for_check)
    except ValueError as error:  # the loss's own validation, e.g. temperature <= 0
        raise UserError(f"{source}: loss '{name}': {error}") from None
    return kwargs


__all__ = [
    "BY_KIND",
    "LOSSES",
    "KIND",
    "build",
    "check_loss_kwargs",
    "NTXentLoss",
    "ntxent_loss",
    "DCLLoss",
    "dcl_loss",
    "DCLWLoss",
    "dclw_loss",
    "NCELoss",
    "nce_loss",
    "BarlowTwinsLoss",
    "barlow_twins_loss",
    "VICRegLoss",
    "vicreg_loss",
    "MoCoV3Loss",
    "mocov3_loss",
    "BYOLLoss",
    "byol_loss",
    "SimSiamLoss",
    "simsiam_loss",
    "DINOLoss",
    "dino_loss",
    "dino_teacher_temperature",
    "ContrastiveLoss",
    "TripletLoss",
    "LiftedStructureLoss",
    "NPairLoss",
    "AngularLoss",
    "SoftNearestNeighborsLoss",
    "SupConLoss",
    "supcon_loss",
    "CircleLoss",
    "MultiSimilarityLoss",
    "multi_similarity_loss",
    "ProxyNCAHead",
    "ProxyAnchorHead",
    "SoftmaxHead",
    "NormSoftmaxHead",
    "CoCoHead",
    "LSoftmaxHead",
    "SphereFaceHead",
    "CosFaceHead",
    "ArcFaceHead",
    "AdaCosHead",
    "AdaCosDynamicHead",
]
