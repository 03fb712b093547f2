"""What ``sslkit-tune`` searches and what it maximizes: ``--search KEY=SPACE`` parsed and ``--metric`` named.

A space is one recipe key and the values a trial may give it:

    optim.lr=log:1e-4,1e-2         log-uniform between the two bounds (both above 0)
    optim.weight_decay=uniform:0,0.1
    train.epochs=int:10,300        an integer; int:10,300,10 steps by 10 (10, 20, ..., 300)
    loss.name=choice:ntxent,dcl    one of the values, each as an override spells it

Each trial's values reach its run as overrides (``optim.lr=0.00123``), read as YAML, as the user's own are. This
module imports no torch: the command checks every space against the recipe's schema (the key exists, every
bound and choice has the key's type) before the library is imported, and names the metric a run cannot record.

>>> parse_space("optim.lr=log:1e-4,1e-2")
Space(key='optim.lr', kind='log', low=0.0001, high=0.01, step=None, choices=())
>>> parse_space("train.epochs=int:10,300,10").text()
'int:10,300,10'
>>> parse_space("loss.name=choice:ntxent, dcl").overrides()
['loss.name=ntxent', 'loss.name=dcl']
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from sslkit.errors import UserError
from sslkit.schema import apply_overrides, parse_config, read_yaml

KINDS = ("log", "uniform", "int", "choice")
SPACE_FORM = (
    "KEY=log:LOW,HIGH, KEY=uniform:LOW,HIGH, KEY=int:LOW,HIGH[,STEP] or KEY=choice:A,B,...; "
    "e.g. --search optim.lr=log:1e-4,1e-2"
)
DOTTED_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")

# The figures a run's results.json holds for its trained encoder (results.trained), by name: the kNN and linear
# probe on a labelled test split, the network's own classifier (fine-tuning, distilling and FixMatch:
# finetune_top1; a supervised head: head_top1), and retrieval among held-out classes (prefixed unseen_).
METRIC = re.compile(
    r"knn_top1|linear_(top1|top5|train_top1)|finetune_top1|head_top1|unseen_(recall@\d+|r_precision|map@r|nmi)"
)
METRICS_TEXT = (
    "knn_top1, linear_top1, linear_top5, finetune_top1 (fine-tune, distill, FixMatch), head_top1 (a supervised "
    "head), unseen_map@r, unseen_recall@K, unseen_r_precision, unseen_nmi (retrieval)"
)


@dataclass(frozen=True)
class Space:
    """One key and the values a trial may give it.

    Attributes:
        key: the dotted recipe key, e.g. ``optim.lr``.
        kind: ``log`` (log-uniform), ``uniform``, ``int`` or ``choice``.
        low: the lower bound (log, uniform, int), included.
        high: the upper bound, included.
        step: the step of an ``int`` space (None: 1).
        choices: the values of a ``choice`` space, each as an override's right-hand side.
    """

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    step: int | None = None
    choices: tuple[str, ...] = ()

    def text(self) -> str:
        """The space as ``--search`` spells it, after the key: ``log:0.0001,0.01``."""
        if self.kind == "choice":
            return "choice:" + ",".join(self.choices)
        bounds = [self.low, self.high] + ([self.step] if self.step is not None else [])
        return f"{self.kind}:" + ",".join(f"{value:g}" if isinstance(value, float) else str(value) for value in bounds)

    def overrides(self) -> list[str]:
        """The overrides of its extreme values: both bounds, or every choice (what the schema checks)."""
        values = self.choices if self.kind == "choice" else (override_value(self.low), override_value(self.high))
        return [f"{self.key}={value}" for value in values]

    def suggest(self, trial: Any) -> float | int | str:
        """A value for ``trial`` (an ``optuna.Trial``), recorded there under :attr:`key`."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.key, self.low, self.high, step=self.step or 1)
        return trial.suggest_float(self.key, self.low, self.high, log=self.kind == "log")

    def as_dict(self) -> dict[str, Any]:
        """The space as plain JSON values, as a study stores it."""
        return {**asdict(self), "choices": list(self.choices)}


def override_value(value: float | int | str) -> str:
    """A trial's value as an override's right-hand side that YAML reads back as the same value:
    ``1e-05`` (a string to YAML 1.1) is written ``1.0e-05``."""
    if isinstance(value, str):
        return value
    text = repr(value)
    mantissa, e, exponent = text.partition("e")
    if e and "." not in mantissa:
        text = f"{mantissa}.0e{exponent}"
    return text


def parse_space(text: str) -> Space:
    """``KEY=KIND:ARGS`` -> a :class:`Space`.

    Raises:
        UserError: one line naming what does not parse and the forms that do.
    """
    key, sep, spec = text.partition("=")
    key, (kind, colon, args) = key.strip(), spec.partition(":")
    kind = kind.strip()
    if not sep or not DOTTED_KEY.fullmatch(key) or not colon or kind not in KINDS:
        raise UserError(f"--search '{text}' must look like {SPACE_FORM}")
    if kind == "choice":
        choices = tuple(choice_texts(args, text))
        if len(choices) < 2 or len(set(choices)) < len(choices):
            raise UserError(f"--search '{text}': give two or more different choices, e.g. {key}=choice:A,B")
        return Space(key, kind, choices=choices)
    numbers = [part.strip() for part in args.split(",")]
    if kind == "int":
        bounds = [_number(part, int, text) for part in numbers]
        if len(bounds) not in (2, 3):
            raise UserError(f"--search '{text}': int takes LOW,HIGH or LOW,HIGH,STEP, e.g. {key}=int:10,300,10")
        low, high, step = (*bounds, None)[:3]
        if not low < high or (step is not None and (step < 1 or (high - low) % step)):
            raise UserError(
                f"--search '{text}': an int space needs LOW < HIGH and a STEP of 1 or more that divides HIGH - LOW"
            )
        return Space(key, kind, low, high, step)
    bounds = [_number(part, float, text) for part in numbers]
    if len(bounds) != 2 or not bounds[0] < bounds[1]:
        raise UserError(f"--search '{text}': {kind} takes two bounds LOW,HIGH with LOW < HIGH")
    if kind == "log" and bounds[0] <= 0:
        raise UserError(f"--search '{text}': a log space needs bounds above 0, e.g. {key}=log:1e-4,1e-2")
    return Space(key, kind, *bounds)


def _number(part: str, kind: type, text: str) -> float | int:
    try:
        value = kind(part)
    except ValueError:
        raise UserError(f"--search '{text}': '{part}' is not {'an integer' if kind is int else 'a number'}") from None
    if not math.isfinite(value):
        raise UserError(f"--search '{text}': '{part}' is not a finite number")
    return value


def choice_texts(args: str, text: str) -> list[str]:
    """``a, [0.08, 1.0], 3`` -> ``['a', '[0.08, 1.0]', '3']``: the choices as overrides spell them (YAML's flow
    sequence splits them, so that a comma inside brackets stays in its choice)."""
    try:
        values = yaml.safe_load(f"[{args}]")
    except yaml.YAMLError:
        raise UserError(f"--search '{text}': the choices do not parse; write them as A,B,C") from None
    return [value if isinstance(value, str) else json.dumps(value) for value in values]


def parse_search(texts: Sequence[str]) -> list[Space]:
    """Every ``--search``, in order; a key searched twice is one line."""
    if not texts:
        raise UserError(f"nothing to search: give --search {SPACE_FORM.split(' or ')[0]} (one per key)")
    spaces = [parse_space(text) for text in texts]
    keys = [space.key for space in spaces]
    if len(set(keys)) < len(keys):
        raise UserError(f"--search: a key is searched twice ({', '.join(keys)}); give each key one space")
    return spaces


def check_in_schema(recipe: Path, overrides: Sequence[str], spaces: Sequence[Space]) -> None:
    """Every space's key is one the recipe has, and each of its extreme values has that key's type (torch-free:
    the schema only; the registries' names and ranges are checked when the plan loads each config)."""
    raw = read_yaml(recipe)
    for space in spaces:
        for override in space.overrides():
            parse_config(apply_overrides(raw, [*overrides, override]), f"--search {space.key}={space.text()}")


def check_metric_name(metric: str) -> None:
    """A name a run's results.json can hold for its trained encoder."""
    if not METRIC.fullmatch(metric):
        raise UserError(f"--metric {metric}: no run records it; a run records {METRICS_TEXT}")
