"""The roads of the label-efficiency comparison: every way from a budget of labelled images to a classifier.

One registry, :data:`ROADS`, says of each road the run its figure comes from, the metric read from that
run's results, the option that names its recipe, its line in the plot and, for a road from random weights,
its pretrained twin; the runs the comparison plans, its tables and its plot all read it. The gains it reports
pair roads: what pretraining buys (:data:`PRETRAINING`) and what the unlabelled images buy (:data:`UNLABELLED`).

>>> [road.name for road in ROADS.values() if road.run == "frozen"]
['linear', 'knn']
>>> colour("scratch-best") == colour("finetune"), column_header("scratch-long")
(True, 'scratch\\nlong')
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Road:
    """One road, as the tables and the plot show it.

    Attributes:
        name: its column in the tables, and the kind of its runs when it trains them (``finetune-f0.1-s0``).
        run: the kind of run its figure comes from (``frozen``: the pretrained encoder's evaluation); None for
            ``scratch-best``, the better of two runs.
        metric: what it reads from that run's results.
        recipe_option: the option that names its runs' recipe; None when it trains none of its own.
        label: its line in the plot; None: not drawn.
        colour: its line's colour (matplotlib's ``C<n>``); a road from random weights takes its twin's.
        twin: for a road from random weights, the road from the pretrained encoder it is drawn beside (dashed, open
            markers, in the twin's colour).
        by_selection: whether the table of what selection buys compares it (not ``scratch`` and ``scratch-long``:
            ``scratch-best`` stands for them).
    """

    name: str
    run: str | None
    metric: str
    recipe_option: str | None = None
    label: str | None = None
    colour: str | None = None
    twin: str | None = None
    by_selection: bool = True


TOP1 = "finetune_top1"  # a trained run's own classifier's test top-1 (FixMatch's: its weight average's)
SCRATCH_BEST = "scratch (better of 1x and {factor}x epochs)"  # {factor}: --scratch-factor

# In table order.
ROADS = {road.name: road for road in (
    Road("linear", "frozen", "linear_top1", label="linear probe (frozen)", colour="C0"),
    Road("knn", "frozen", "knn_top1"),
    Road("finetune", "finetune", TOP1, "--finetune-recipe", "fine-tune", "C1"),
    Road("distill", "distill", TOP1, "--distill-recipe", "fine-tune + distill", "C2"),
    Road("fixmatch", "fixmatch", TOP1, "--fixmatch-recipe", "FixMatch from the encoder", "C3"),
    Road("fixmatch-distill", "fixmatch-distill", TOP1, "--distill-recipe", "FixMatch + distill", "C4"),
    Road("fixmatch-scratch", "fixmatch-scratch", TOP1, "--fixmatch-recipe", "FixMatch from scratch", twin="fixmatch"),
    Road("scratch", "scratch", TOP1, "--scratch-recipe", by_selection=False),
    Road("scratch-long", "scratch-long", TOP1, "--scratch-recipe", by_selection=False),
    Road("scratch-best", None, TOP1, label=SCRATCH_BEST, twin="finetune"),
)}  # fmt: skip
# The roads whose runs train on the labels, and the option that names each one's recipe.
RECIPE_OPTIONS = {road.run: road.recipe_option for road in ROADS.values() if road.recipe_option is not None}
# What selection buys, road by road.
SELECTION_ROADS = tuple(road.name for road in ROADS.values() if road.by_selection)

# Paired gains, (road, versus) on the same labelled images and seed, in table order: what pretraining buys ...
PRETRAINING = (
    ("finetune", "scratch-best"),
    ("distill", "scratch-best"),
    ("fixmatch", "scratch-best"),
    ("fixmatch-distill", "scratch-best"),
    ("fixmatch", "fixmatch-scratch"),
)
# ... and what the unlabelled images buy: a road that learns from them against its start without them.
UNLABELLED = (
    ("fixmatch", "finetune"),
    ("fixmatch-scratch", "scratch-best"),
    ("distill", "finetune"),
    ("fixmatch-distill", "fixmatch"),
)


def plotted() -> list[Road]:
    """The roads the plot draws, in legend order: those from the pretrained encoder, then those from random weights
    in the order of their twins."""
    drawn = [road for road in ROADS.values() if road.label is not None]
    ours = [road for road in drawn if road.twin is None]
    twins = [road.name for road in ours]
    return ours + sorted((road for road in drawn if road.twin is not None), key=lambda road: twins.index(road.twin))


def colour(name: str) -> str:
    """The colour of a plotted road's line: its own, or its twin's."""
    road = ROADS[name]
    return ROADS[road.twin].colour if road.twin is not None else road.colour


def column_header(road: str) -> str:
    """A road's name in lines of at most 8 characters, so that the table stays narrow."""
    return "fine\ntune" if road == "finetune" else road.replace("-", "\n")
