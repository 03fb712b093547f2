"""Reading a recipe: YAML -> dotted overrides -> a typed :class:`~sslkit.schema.sections.Config`, strictly.

Parsing is strict, because a typo that is silently ignored costs a user a whole training run:

- an unknown key is an error naming the key, the file and the valid keys;
- a value of the wrong type is an error naming the key, the expected type and the file.

This module knows the sections and their types, not the registries: names (dataset, loss,
method) and ranges are checked by :func:`sslkit.config.validate`, which loading a recipe runs
(:func:`sslkit.config.load_config`).

>>> parse_config({"train": {"epochs": 2}}).train.epochs
2
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import yaml

from sslkit.errors import UserError
from sslkit.schema.coercion import coerce
from sslkit.schema.sections import Config, LossConfig, MethodConfig


def _upgrade(raw: dict) -> dict:
    """Recipes and saved ``config.yaml`` files of older sslkit versions, in today's keys: ``train.tensorboard:
    true`` is ``train.trackers: [tensorboard]`` (and ``false`` the default). A run directory made before a
    key was renamed still evaluates and resumes."""
    train = raw.get("train")
    if not isinstance(train, dict) or "tensorboard" not in train:
        return raw
    train = dict(train)
    if train.pop("tensorboard") is True:
        trackers = list(train.get("trackers") or [])
        train["trackers"] = trackers + ([] if "tensorboard" in trackers else ["tensorboard"])
    return {**raw, "train": train}


def _fill(instance: Any, values: dict, prefix: str, source: str) -> None:
    """Set fields of a dataclass ``instance`` from ``values``, strictly."""
    hints = typing.get_type_hints(type(instance))
    names = [f.name for f in dataclasses.fields(instance)]
    for key, value in values.items():
        path = f"{prefix}{key}"
        if key not in names:
            raise UserError(
                f"{source}: unknown key '{path}'; valid keys in '{prefix.rstrip('.') or 'recipe'}': {', '.join(names)}"
            )
        current = getattr(instance, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise UserError(f"{source}: '{path}' must be a section (a mapping), got {value!r}")
            _fill(current, value, f"{path}.", source)
        else:
            setattr(instance, key, coerce(value, hints[key], path, source))


def _split_named_section(raw: dict, section: str, rest: str, default: str) -> dict:
    """``loss: {name: ntxent, temperature: 0.2}`` -> ``{name: ntxent, kwargs: {temperature: 0.2}}`` (``rest``:
    ``kwargs``), and the method section's options alike: the keys beside the name belong to what it names."""
    if section in raw and isinstance(raw[section], dict):
        values = dict(raw[section])
        name = values.pop("name", default)
        others = values.pop(rest, {}) or {}
        others.update(values)
        raw = {**raw, section: {"name": name, rest: others}}
    return raw


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.epochs=5"`` -> ``(["train", "epochs"], 5)``: the dotted key's parts and the value read as YAML."""
    if "=" not in text:
        raise UserError(f"override '{text}' must look like key.sub=value, e.g. train.epochs=5")
    key, _, raw_value = text.partition("=")
    try:
        value = yaml.safe_load(raw_value) if raw_value.strip() else None
    except yaml.YAMLError:
        value = raw_value
    return key.strip().split("."), value


def unknown_option(argv: list[str], options: typing.Iterable[str]) -> int | None:
    """The position in ``argv`` of the first ``--option`` that is none of ``options`` (nor ``-h``, ``--help``).

    Settings are ``key=value`` overrides, not options: :func:`sslkit.config.check_command_line` turns
    what this finds into one line naming the override meant. The search is apart from that message,
    which needs every method's options, so that a command looks before it imports them.
    """
    known = set(options) | {"-h", "--help"}
    return next(
        (i for i, token in enumerate(argv) if token.startswith("-") and token.split("=", 1)[0] not in known), None
    )


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply dotted ``key=value`` overrides to a raw recipe dict (values parsed as YAML)."""
    raw = _to_mutable(raw)
    for text in overrides:
        keys, value = parse_override(text)
        node = raw
        for part in keys[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"override '{text}': '{part}' is not a section")
        node[keys[-1]] = value
    return raw


def _to_mutable(raw: dict) -> dict:
    return {k: _to_mutable(v) if isinstance(v, dict) else v for k, v in raw.items()}


def parse_config(raw: dict | None, source: str = "recipe") -> Config:
    """A :class:`Config` from a plain dict (YAML content plus overrides), checked against the schema only:
    sections, keys and types. :func:`sslkit.config.config_from_dict` also validates names and ranges."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(
            f"{source}: a recipe must be a mapping of sections (run, data, model, ...), got {type(raw).__name__}"
        )
    cfg = Config()
    raw = _split_named_section(_upgrade(raw), "loss", "kwargs", LossConfig.name)
    _fill(cfg, _split_named_section(raw, "method", "options", MethodConfig.name), "", source)
    return cfg


def read_yaml(path: Path) -> dict:
    """The mapping in the YAML file ``path`` (empty for an empty file); invalid YAML is one line naming the line."""
    try:
        return yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}: not valid YAML{where}: {getattr(error, 'problem', error)}") from None


# The recipes that ship with sslkit (the repository's recipes/ links here).
BUNDLED_RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def bundled_recipes() -> dict[str, Path]:
    """``{name: path}`` of the recipes installed with sslkit, e.g. ``"quickstart"``."""
    return {path.stem: path for path in sorted(BUNDLED_RECIPES.glob("*.yaml"))}


def find_recipe(recipe: str | Path) -> Path:
    """The YAML file ``recipe`` names: a file that exists, else a bundled recipe.

    ``quickstart``, ``quickstart.yaml`` and ``recipes/quickstart.yaml`` all name the bundled
    ``sslkit/recipes/quickstart.yaml`` when no such file exists where the command runs, so the
    README's commands work from any directory once sslkit is installed; a file of the user's
    own (an edited copy in ./recipes, say) always wins.
    """
    path = Path(recipe)
    if path.is_file():
        return path
    bundled = bundled_recipes()
    if path.is_dir():
        example = (
            path / "quickstart.yaml"
            if (path / "quickstart.yaml").is_file()
            else next(iter(sorted(path.glob("*.yaml"))), None)
        )
        raise UserError(
            f"recipe '{recipe}' is a folder; give a YAML file"
            + (f" in it, e.g. {example}" if example else "")
            + f", or a bundled recipe's name ({', '.join(bundled)})"
        )
    name = path.stem if path.suffix in (".yaml", ".yml") else path.name
    if path.parent in (Path("."), Path("recipes")) and name in bundled:
        return bundled[name]
    raise UserError(
        f"recipe '{recipe}' not found: give a YAML file's path or a bundled recipe's name ({', '.join(bundled)})"
    )


def bundled_variants() -> dict[str, Path]:
    """``{name: path}`` of the variant files installed with sslkit (``sslkit-ablate --variants``)."""
    return {path.stem: path for path in sorted((BUNDLED_RECIPES / "variants").glob("*.yaml"))}


def find_variants(variants: str | Path) -> Path:
    """The YAML file ``--variants`` names: a file that exists, else a bundled variants file by its name or by
    the path it has in a clone (``recipes/variants/NAME.yaml``), as :func:`find_recipe` finds recipes."""
    path = Path(variants)
    if path.is_file():
        return path
    bundled = bundled_variants()
    name = path.stem if path.suffix in (".yaml", ".yml") else path.name
    if path.parent in (Path("."), Path("variants"), Path("recipes") / "variants") and name in bundled:
        return bundled[name]
    raise UserError(
        f"--variants '{variants}' not found: give a YAML file's path or a bundled variants file's name "
        f"({', '.join(bundled)})"
    )
