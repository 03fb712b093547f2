"""Writing a recipe: a :class:`~sslkit.schema.sections.Config` as plain data, dotted keys or a YAML file.

:func:`to_dict` is the form a run saves (``config.yaml``) and reads back: the loss's arguments and
the method's options beside their names, as a recipe writes them. :func:`flatten` spells its keys
as overrides do (``train.epochs``), for tables, trackers and sweeps.

>>> flatten({"train": {"epochs": 4}})
{'train.epochs': 4}
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from sslkit.schema.sections import Config


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """``{"train": {"epochs": 4}}`` -> ``{"train.epochs": 4}``: the keys as overrides spell them."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def to_dict(cfg: Config) -> dict:
    """Plain-dict form of a config (the loss kwargs and the method options back beside their names)."""
    data = dataclasses.asdict(cfg)
    data["method"] = {"name": cfg.method.name, **data["method"]["options"]}
    loss = data.pop("loss")  # last, as saved configs have it
    data["loss"] = {"name": loss["name"], **loss["kwargs"]}
    return _plain(data)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the fully resolved config as YAML next to the run's checkpoints."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
