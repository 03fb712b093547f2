"""Recipes for users: load one, with dotted ``key=value`` overrides, and check it before anything runs.

A recipe is a YAML file whose top-level sections match the dataclasses of
:mod:`sslkit.schema`, which reads it strictly (an unknown key or a value of the wrong type is an
error naming the key and the file). Loading it here also checks it against every registry,
because a typo that is silently ignored costs a user a whole training run:

- an unknown name (dataset, backbone, loss, optimizer, method) is an error listing the choices;
- a number out of its range is an error naming the key and the valid range;
- a method's own options, its loss and its batch are checked by the method
  (:func:`sslkit.methods.check_config`), a loss's arguments by the loss.

All of these raise :class:`sslkit.errors.UserError` with one line; entry points print it
without a traceback. Nothing rewrites a value silently: derived values (the scaled learning
rate, the per-process batch) are computed in the trainer and logged.

This package sits above the registries it checks against (datasets, losses, methods, models,
optim) and imports them; they import the schema (:mod:`sslkit.schema`), never this package. It
re-exports the schema, so ``from sslkit.config import Config, load_config`` is all a user needs.

The recipes in ``recipes/`` ship inside the package (``sslkit/recipes``), so a bare name works
from any directory once sslkit is installed (:func:`find_recipe`):

>>> cfg = load_config("quickstart", ["train.epochs=2", "loss.temperature=0.2"])
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import typing
from pathlib import Path

import torch
from rich.console import Console

from sslkit import datasets, losses, methods, models, optim
from sslkit.datasets.retrieval import READERS as RETRIEVAL_DATASETS
from sslkit.errors import UserError
from sslkit.schema import (
    BUNDLED_RECIPES,
    AugmentConfig,
    Config,
    DataConfig,
    EvalConfig,
    EvalDataConfig,
    LossConfig,
    MethodConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
    apply_overrides,
    bundled_recipes,
    coerce,
    field_docs,
    find_recipe,
    flatten,
    parse_config,
    parse_override,
    read_yaml,
    save_config,
    to_dict,
    unknown_option,
)

_PRINTED_NOTES: set[tuple[Path, str]] = set()  # the loss-replacement notes this process printed, by recipe


def config_from_dict(raw: dict, source: str = "recipe") -> Config:
    """Build and validate a :class:`Config` from a plain dict (YAML content plus overrides)."""
    cfg = parse_config(raw, source)
    validate(cfg, source)
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Read a YAML recipe (a path, or a bundled recipe's name: :func:`find_recipe`), apply
    ``key=value`` overrides, and validate it."""
    path = find_recipe(path)
    raw = read_yaml(path)
    source = str(path) + (" (with command-line overrides)" if overrides else "")
    merged = apply_overrides(raw, overrides or [])
    notes = [replace_recipe_loss(raw, merged, overrides or []), replace_recipe_labels(merged, overrides or [])]
    for note in filter(None, notes):
        # Once, not from every process of a launch, nor for every point of a sweep that loads the recipe again.
        if (path, note) not in _PRINTED_NOTES and os.environ.get("RANK", "0") == "0":
            _PRINTED_NOTES.add((path, note))
            Console(stderr=True).print(note, highlight=False, markup=False, soft_wrap=True)
    return config_from_dict(merged, source)


# The keys that say which images keep their labels; a recipe sets at most one.
LABEL_CHOICES = ("label_subset", "label_fraction", "labels_per_class")


def replace_recipe_labels(merged: dict, overrides: list[str]) -> str:
    """When the command line says which images keep their labels, drop the recipe's other way of saying it.

    ``data.label_subset``, ``data.label_fraction`` and ``data.labels_per_class`` exclude each other. A
    recipe with ``label_fraction: 0.01`` run with ``data.label_subset=chosen.json`` on the command line
    means the label file: the command line is the more specific. Edits ``merged`` in place and returns
    the note saying what was dropped, or "" if nothing was. Two of them given on the command line are
    left for :func:`validate` to refuse.
    """
    data = merged.get("data")
    given = {
        keys[1]
        for keys, value in map(parse_override, overrides)
        if len(keys) == 2 and keys[0] == "data" and value is not None
    }
    chosen = [key for key in LABEL_CHOICES if key in given and len(given & set(LABEL_CHOICES)) == 1]
    if not isinstance(data, dict) or not chosen:
        return ""
    dropped = [f"data.{key}={data[key]}" for key in LABEL_CHOICES if key != chosen[0] and data.get(key) is not None]
    if not dropped:
        return ""
    for key in LABEL_CHOICES:
        if key != chosen[0]:
            data[key] = None
    return f"note: data.{chosen[0]}={data[chosen[0]]} from the command line replaces the recipe's {', '.join(dropped)}"


def replace_recipe_loss(recipe: dict, merged: dict, overrides: list[str]) -> str:
    """When the command line names another loss, drop the recipe's ``loss.*`` keys that loss does not take.

    The recipe's loss keys were written for the recipe's loss (``temperature`` for NT-Xent,
    ``margin`` for ArcFace): switching ``loss.name=arcface`` on the command line would
    otherwise fail on ``loss.temperature``, and an ablation over ``loss.name`` could not run.
    Keys the new loss also takes are kept (``ntxent`` -> ``dcl`` keeps the temperature); keys
    given on the command line are kept too, and checked as usual. Edits ``merged`` in place and
    returns a note saying what was kept and dropped (a kept ``margin`` may mean something else
    for the new loss: ArcFace's is an angle, CosFace's a cosine), or "" if the loss is unchanged.
    """
    recipe_loss = recipe.get("loss") if isinstance(recipe.get("loss"), dict) else {}
    merged_loss = merged.get("loss")
    if not isinstance(merged_loss, dict):
        return ""
    old, name = recipe_loss.get("name", LossConfig.name), merged_loss.get("name", LossConfig.name)
    if name == old or not isinstance(name, str) or name not in losses.LOSSES:
        return ""  # same loss, or an unknown name that validate() reports with the choices
    accepted = losses.loss_arguments(name)
    given = {tuple(keys) for keys, _ in map(parse_override, overrides)}
    from_recipe = [key for key in recipe_loss if key not in ("name", "kwargs") and ("loss", key) not in given]
    if not from_recipe:
        return ""
    kept = [f"loss.{key}={merged_loss[key]}" for key in from_recipe if key in accepted]
    dropped = [f"loss.{key}={merged_loss.pop(key)}" for key in from_recipe if key not in accepted]
    parts = [f"note: loss.name={name} replaces the recipe's loss '{old}'"]
    if kept:
        values = "the value suits" if len(kept) == 1 else "the values suit"
        parts.append(f"kept {', '.join(kept)} from the recipe, which {name} also takes (check {values} {name})")
    if dropped:
        parts.append(f"dropped {', '.join(dropped)} ({name} does not take {'it' if len(dropped) == 1 else 'them'})")
    return "; ".join(parts)


def check_command_line(argv: list[str], options: typing.Iterable[str]) -> None:
    """One line for a ``--option`` the command does not take, with the override it probably meant.

    Settings are ``section.key=value`` overrides; ``--epochs 3`` (as other trainers spell it)
    would otherwise get argparse's usage text listing every later argument as unrecognised.
    """
    options = tuple(options)
    index = unknown_option(argv, options)
    if index is None:
        return
    token = argv[index]
    name = token.lstrip("-").split("=", 1)[0].replace("-", "_")
    keys = [key for key in recipe_keys() if key.rsplit(".", 1)[-1] == name]
    following = argv[index + 1] if index + 1 < len(argv) else ""
    if "=" in token:  # --lr=0.1
        value = token.split("=", 1)[1]
    elif following and not following.startswith("-") and "=" not in following:  # --epochs 3
        value = following
    else:
        value = "..."
    meant = f"; did you mean {' or '.join(f'{key}={value}' for key in keys)}?" if keys else ""
    raise UserError(
        f"unknown option '{token}': settings are key=value overrides such as train.epochs=3 "
        f"(options: {', '.join(sorted({*options, '-h', '--help'}))}){meant}"
    )


def recipe_keys() -> list[str]:
    """Every key a recipe can set, as overrides spell them: the sections' and every method's options."""
    return [*flatten(to_dict(Config())), *(f"method.{key}" for key in methods.option_fields())]


# --------------------------------------------------------------------------- validation


def _check_choice(value: str, choices: typing.Iterable[str], key: str, source: str) -> None:
    choices = sorted(choices)
    if value not in choices:
        raise UserError(f"{source}: unknown {key} '{value}'; choose one of: {', '.join(choices)}")


def _check_range(value: float, key: str, source: str, low: float | None = None, high: float | None = None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = (
            f"in [{low}, {high}]"
            if low is not None and high is not None
            else (f">= {low}" if low is not None else f"<= {high}")
        )
        raise UserError(f"{source}: '{key}' must be {bounds}, got {value}")


def _check_local_views(augment, source: str) -> None:
    """``local_views`` >= 0 and, with local views, a ``local_size`` of at most the global views' ``image_size``."""
    if augment.local_views < 0:
        raise UserError(
            f"{source}: 'augment.local_views' must be >= 0 (0: the two global views only), got {augment.local_views}"
        )
    if augment.local_views and not 0 < augment.local_size <= augment.image_size:
        what = "must be set" if augment.local_size <= 0 else "must not be larger than the global views"
        raise UserError(
            f"{source}: 'augment.local_size' {what} with augment.local_views={augment.local_views}: "
            f"give a side in [1, augment.image_size={augment.image_size}], got {augment.local_size}"
        )


def _check_label_subset(section, prefix: str, source: str) -> None:
    """``label_fraction`` in (0, 1], ``labels_per_class`` >= 1, and not both (``data.*`` or ``eval.*``)."""
    fraction, per_class = section.label_fraction, section.labels_per_class
    if fraction is not None and not 0 < fraction <= 1:
        raise UserError(
            f"{source}: '{prefix}.label_fraction' must be in (0, 1] (0.01 keeps 1% of the labels), got {fraction}"
        )
    if per_class is not None:
        _check_range(per_class, f"{prefix}.labels_per_class", source, 1)
    if fraction is not None and per_class is not None:
        raise UserError(
            f"{source}: set {prefix}.label_fraction or {prefix}.labels_per_class, not both (got {fraction} and "
            f"{per_class}); set the other to null, e.g. "
            f"{prefix}.label_fraction=null {prefix}.labels_per_class={per_class}"
        )


def _check_validation(cfg: Config, source: str) -> None:
    """``data.val_fraction`` in (0, 1), on data whose labelled training split holds every class it is measured on."""
    fraction, data = cfg.data.val_fraction, cfg.data
    if fraction is None:
        return
    if not 0 < fraction < 1:
        raise UserError(f"{source}: 'data.val_fraction' must be in (0, 1) (0.1 holds out 10%), got {fraction}")
    for used, key in (
        (bool(data.holdout_classes), "data.holdout_classes (their retrieval reads the test split)"),
        (data.name in RETRIEVAL_DATASETS or data.class_split is not None, "class-disjoint data"),
        (cfg.eval.data.name is not None or cfg.eval.data.root is not None, "eval.data"),
    ):
        if used:
            raise UserError(
                f"{source}: data.val_fraction holds out labelled training images of the classes it evaluates; it "
                f"cannot be combined with {key}: drop one of the two"
            )


def _check_label_file(data, source: str) -> None:
    """``data.label_subset`` (a label file) names the labelled images: not with a fraction or a count per class."""
    if data.label_subset is not None and (data.label_fraction is not None or data.labels_per_class is not None):
        other = "label_fraction" if data.label_fraction is not None else "labels_per_class"
        raise UserError(
            f"{source}: data.label_subset={data.label_subset} names the labelled images itself; set one of the "
            f"two: drop data.{other} (data.{other}=null), or the label file (data.label_subset=null)"
        )


# Accelerate's tracker names and the package each needs.
TRACKERS = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "comet_ml": "comet_ml",
    "aim": "aim",
    "mlflow": "mlflow",
    "clearml": "clearml",
    "dvclive": "dvclive",
    "swanlab": "swanlab",
    "trackio": "trackio",
}


def _check_trackers(trackers: list[str], source: str) -> None:
    """Known tracker names, each with its package installed (Accelerate would only warn and log nothing)."""
    for name in trackers:
        _check_choice(name, TRACKERS, "train.trackers", source)
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise UserError(
                f"{source}: train.trackers has {name}, but the {TRACKERS[name]} package is not installed: "
                f"pip install {TRACKERS[name]} (or remove {name} from train.trackers)"
            )


def _check_stop_signals(names: list[str], source: str) -> None:
    """Signals a process can catch, by name (``SIGTERM`` or ``TERM``); SIGKILL and SIGSTOP cannot be."""
    catchable = sorted(s.name for s in signal.valid_signals() if isinstance(s, signal.Signals)) if names else []
    catchable = [name for name in catchable if name not in ("SIGKILL", "SIGSTOP")]
    for name in names:
        full = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
        if full not in catchable:
            raise UserError(
                f"{source}: train.stop_signals has {name!r}, which is not a signal this process can catch; "
                f"use names such as SIGTERM, SIGUSR1, SIGUSR2, SIGINT (or [] to keep the signals' default action)"
            )


def _check_compile(backend: str, source: str) -> None:
    """A backend ``torch.compile`` knows, on a torch and Python that it supports."""
    _check_choice(backend, torch.compiler.list_backends(exclude_tags=()), "train.compile_backend", source)
    # torch.compile raises on Python versions its dynamo does not support yet (a new Python before its torch).
    # A private function, without a public one; where it is gone, the first compiled step is the check.
    is_supported = getattr(getattr(torch, "_dynamo", None), "is_dynamo_supported", lambda: True)
    if not is_supported():
        raise UserError(
            f"{source}: train.compile=true, but torch {torch.__version__} cannot compile on Python "
            f"{sys.version.split()[0]} here; set train.compile=false"
        )


def _check_image_files(cfg: Config, source: str, datasets: typing.Iterable[str]) -> None:
    """``data.max_size``, ``data.on_corrupt``, ``data.decode``, ``data.augment_in_workers`` and ``eval.data``."""
    _check_choice(cfg.data.on_corrupt, ("skip", "error"), "data.on_corrupt", source)
    _check_choice(cfg.data.decode, ("auto", "cpu"), "data.decode", source)
    if isinstance(cfg.data.augment_in_workers, str) and cfg.data.augment_in_workers != "auto":
        raise UserError(
            f"{source}: unknown data.augment_in_workers '{cfg.data.augment_in_workers}'; "
            f"choose one of: auto, true, false"
        )
    if cfg.data.max_size is not None:
        _check_range(cfg.data.max_size, "data.max_size", source, 1)
    if cfg.eval.data.name is not None:
        _check_choice(cfg.eval.data.name, set(datasets) - {"webdataset"}, "eval.data.name", source)


def validate(cfg: Config, source: str = "recipe") -> None:
    """Check names against the registries and numbers against their valid ranges."""
    name = cfg.run.name
    if not name or name in (".", "..") or "/" in name or os.sep in name:  # it is joined to run.output_dir
        raise UserError(
            f"{source}: 'run.name' must be a plain folder name (no '/', not '.' or '..'), got {name!r}; "
            f"choose where runs go with run.output_dir"
        )
    _check_choice(cfg.data.name, datasets.DATASETS, "data.name", source)
    _check_choice(cfg.data.sampler, datasets.SAMPLERS, "data.sampler", source)
    _check_range(cfg.data.m_per_class, "data.m_per_class", source, 1)
    if cfg.data.sampler == "m_per_class" and cfg.data.m_per_class < 2:
        raise UserError(
            f"{source}: data.m_per_class={cfg.data.m_per_class} puts one image of each class in a batch, so no "
            f"image has a positive; use 2 or more (4 in 'A Metric Learning Reality Check')"
        )
    if cfg.data.class_split is not None:
        _check_range(cfg.data.class_split, "data.class_split", source, 0, 1)
        if cfg.data.class_split in (0, 1) or cfg.data.name != "imagefolder" or cfg.data.image_size is not None:
            raise UserError(
                f"{source}: data.class_split={cfg.data.class_split}: give a fraction strictly between 0 and 1, with "
                f"data.name=imagefolder and data.image_size null (the retrieval benchmarks cub200, cars196, sop and "
                f"inshop have their own class split)"
            )
    _check_validation(cfg, source)
    if cfg.data.sampler == "m_per_class" and cfg.data.name == "webdataset":
        raise UserError(
            f"{source}: data.sampler=m_per_class needs labelled images, and tar shards are unlabelled; "
            f"use data.sampler=random, or a labelled dataset (an image folder with train/<class>/)"
        )
    _check_choice(cfg.method.name, methods.METHODS, "method.name", source)
    _check_choice(cfg.loss.name, losses.LOSSES, "loss.name", source)
    _check_choice(cfg.optim.name, optim.OPTIMIZERS, "optim.name", source)
    _check_choice(cfg.optim.lr_scaling, ("none", "linear", "sqrt"), "optim.lr_scaling", source)
    _check_choice(cfg.train.mixed_precision, ("no", "fp16", "bf16"), "train.mixed_precision", source)
    if cfg.run.resume not in (None, "auto") and not Path(cfg.run.resume).exists():
        raise UserError(f"{source}: run.resume '{cfg.run.resume}' does not exist; use 'auto' or a checkpoint path")
    for key, value in (
        ("augment.hflip_p", cfg.augment.hflip_p),
        ("augment.jitter_p", cfg.augment.jitter_p),
        ("augment.grayscale_p", cfg.augment.grayscale_p),
        ("augment.blur_p", cfg.augment.blur_p),
        ("augment.solarize_p", cfg.augment.solarize_p),
    ):
        _check_range(value, key, source, 0.0, 1.0)
    for key, value in (
        ("augment.jitter_p_view2", cfg.augment.jitter_p_view2),
        ("augment.blur_p_view2", cfg.augment.blur_p_view2),
        ("augment.solarize_p_view2", cfg.augment.solarize_p_view2),
        ("augment.local_blur_p", cfg.augment.local_blur_p),
        ("augment.local_solarize_p", cfg.augment.local_solarize_p),
    ):
        if value is not None:
            _check_range(value, key, source, 0.0, 1.0)
    if cfg.augment.blur_kernel and (cfg.augment.blur_kernel % 2 == 0 or cfg.augment.blur_kernel < 3):
        raise UserError(
            f"{source}: 'augment.blur_kernel' must be an odd size >= 3 (or 0 for 10% of image_size), "
            f"got {cfg.augment.blur_kernel}"
        )
    if not 0 < cfg.augment.crop_ratio[0] <= cfg.augment.crop_ratio[1]:
        raise UserError(
            f"{source}: 'augment.crop_ratio' must be [low, high] with 0 < low <= high, "
            f"got {list(cfg.augment.crop_ratio)}"
        )
    for key, scale in (
        ("augment.crop_scale", cfg.augment.crop_scale),
        ("augment.crop_scale_view2", cfg.augment.crop_scale_view2),
        ("augment.local_crop_scale", cfg.augment.local_crop_scale),
    ):
        if scale is not None and not 0 < scale[0] <= scale[1] <= 1:
            raise UserError(f"{source}: '{key}' must be [low, high] with 0 < low <= high <= 1, got {list(scale)}")
    for key, value in (
        ("train.epochs", cfg.train.epochs),
        ("train.batch_size", cfg.train.batch_size),
        ("train.grad_accum_steps", cfg.train.grad_accum_steps),
        ("augment.image_size", cfg.augment.image_size),
        ("model.width", cfg.model.width),
        ("eval.knn_k", cfg.eval.knn_k),
    ):
        _check_range(value, key, source, 1)
    _check_local_views(cfg.augment, source)
    # A timm model is built on the meta device here: a name, argument or image size it cannot take is one line now.
    local_size = cfg.augment.local_size if cfg.augment.local_views else None
    models.check_backbone(cfg.model, cfg.augment.image_size, source, local_size)
    # Before any data is read (sslkit-ablate checks every point of a sweep up front): the method's options,
    # its loss and its batch, checked by the method itself.
    methods.check_config(cfg, source)
    _check_range(cfg.eval.linear_epochs, "eval.linear_epochs", source, 0)
    ks = cfg.eval.recall_ks
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise UserError(
            f"{source}: 'eval.recall_ks' must be a non-empty list of integers >= 1 such as [1, 2, 4, 8], got {ks}"
        )
    if cfg.train.threads is not None:  # null: automatic (see sslkit/loop/launch.py)
        _check_range(cfg.train.threads, "train.threads", source, 1)
    if cfg.train.max_steps is not None:  # null: no limit (0 would train nothing and report it as trained)
        _check_range(cfg.train.max_steps, "train.max_steps", source, 1)
    for key, value in (
        ("train.freeze_backbone_epochs", cfg.train.freeze_backbone_epochs),
        ("train.checkpoint_every_steps", cfg.train.checkpoint_every_steps),
        ("train.knn_every_epochs", cfg.train.knn_every_epochs),
    ):  # 0: off
        _check_range(value, key, source, 0)
    for key, value in (
        ("train.keep_checkpoints", cfg.train.keep_checkpoints),
        ("train.checkpoint_every_epochs", cfg.train.checkpoint_every_epochs),
    ):
        _check_range(value, key, source, 1)
    _check_trackers(cfg.train.trackers, source)
    _check_stop_signals(cfg.train.stop_signals, source)
    if cfg.train.compile:
        _check_compile(cfg.train.compile_backend, source)
    _check_choice(cfg.train.compile_mode, ("default", "reduce-overhead", "max-autotune"), "train.compile_mode", source)
    if not 0 < cfg.optim.layer_decay <= 1:
        raise UserError(
            f"{source}: 'optim.layer_decay' must be in (0, 1] (1: off; BEiT uses 0.65), got {cfg.optim.layer_decay}"
        )
    for key, value in (("optim.lr", cfg.optim.lr), ("eval.knn_temperature", cfg.eval.knn_temperature)):
        if not value > 0:
            raise UserError(f"{source}: '{key}' must be > 0, got {value}")
    _check_label_subset(cfg.data, "data", source)
    _check_label_file(cfg.data, source)
    _check_image_files(cfg, source, datasets.DATASETS)
    _check_label_subset(cfg.eval, "eval", source)
    cfg.loss.kwargs = losses.check_loss_kwargs(cfg.loss.name, cfg.loss.kwargs, source)


__all__ = [
    "BUNDLED_RECIPES",
    "AugmentConfig",
    "Config",
    "DataConfig",
    "EvalConfig",
    "EvalDataConfig",
    "LossConfig",
    "MethodConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "TrainConfig",
    "TRACKERS",
    "apply_overrides",
    "bundled_recipes",
    "check_command_line",
    "coerce",
    "config_from_dict",
    "field_docs",
    "find_recipe",
    "flatten",
    "load_config",
    "parse_config",
    "read_yaml",
    "recipe_keys",
    "replace_recipe_loss",
    "save_config",
    "to_dict",
    "validate",
]
