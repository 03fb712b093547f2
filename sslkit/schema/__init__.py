"""The recipe's schema: its typed sections, reading YAML and overrides into them, and writing them back.

A recipe is a YAML file whose top-level sections match the dataclasses of
:mod:`sslkit.schema.sections`. This package knows the sections, their keys and their types, and
nothing of the registries (datasets, losses, methods, models, optimizers), so every package may
import it: the methods check their options with :func:`coerce`, the losses their arguments, the
augmentation reads its :class:`AugmentConfig`. Checking a recipe's names against the registries
and loading it for a user is :mod:`sslkit.config`, which sits above them all.

- :mod:`sslkit.schema.sections`  the dataclasses, and :func:`field_docs` for their documented keys.
- :mod:`sslkit.schema.coercion`  a value against its field's type: the one type check of recipe values.
- :mod:`sslkit.schema.reading`   YAML, dotted overrides and the bundled recipes -> a :class:`Config`.
- :mod:`sslkit.schema.writing`   a :class:`Config` -> a plain dict, dotted keys, ``config.yaml``.
"""

from sslkit.schema.coercion import coerce
from sslkit.schema.reading import (
    BUNDLED_RECIPES,
    apply_overrides,
    bundled_recipes,
    find_recipe,
    parse_config,
    parse_override,
    read_yaml,
    unknown_option,
)
from sslkit.schema.sections import (
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
    field_docs,
)
from sslkit.schema.writing import flatten, save_config, to_dict

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
    "apply_overrides",
    "bundled_recipes",
    "coerce",
    "field_docs",
    "find_recipe",
    "flatten",
    "parse_config",
    "parse_override",
    "read_yaml",
    "save_config",
    "to_dict",
    "unknown_option",
]
