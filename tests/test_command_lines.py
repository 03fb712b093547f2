"""Each command an experiment starts reads back the arguments its builder writes: ``parse_args(build_argv(...))``
gives what was asked, and the command run as ``python -m MODULE`` parses with that very parser."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from sslkit.command_lines import embed, evaluate, label_selection, pretrain

# Paths as experiments give them, and as users name theirs: spaces, an '=' and a leading dash inside.
ODD = Path("/data/my runs/lr=0.1/-x")


@pytest.mark.parametrize("command", [pretrain, evaluate, embed, label_selection])
def test_the_module_an_experiment_starts_parses_with_the_parser_beside_the_builder(command):
    assert importlib.import_module(command.MODULE).parse_args is command.parse_args


@pytest.mark.parametrize(
    "recipe, overrides",
    [("quickstart", []), (ODD / "r.yaml", ["train.epochs=5", "data.label_subset=/a b/c.json", "run.name=x"])],
)
def test_pretrain_round_trip(recipe, overrides):
    args = pretrain.parse_args(pretrain.build_argv(recipe, overrides))
    assert (args.recipe, args.overrides) == (str(recipe), overrides)


@pytest.mark.parametrize(
    "keywords",
    [{}, {"out": ODD / "points" / "frozen-f0.1-s0.json"}, {"recipe": "quickstart", "linear": False, "out": "e.json"}],
)
def test_evaluate_round_trip(keywords):
    overrides = ["eval.label_fraction=0.1", "data.label_seed=3"]
    args = evaluate.parse_args(evaluate.build_argv(ODD, overrides, **keywords))
    assert (args.target, args.overrides) == (str(ODD), overrides)
    out, recipe = keywords.get("out"), keywords.get("recipe")
    assert args.out == (None if out is None else str(out)) and args.recipe == recipe
    assert args.no_linear is not keywords.get("linear", True)


@pytest.mark.parametrize(
    "keywords", [{}, {"split": "train", "out": ODD / "embeddings"}, {"data": "digits", "recipe": "quickstart"}]
)
def test_embed_round_trip(keywords):
    args = embed.parse_args(embed.build_argv(ODD, ["train.threads=2"], **keywords))
    assert (args.source, args.overrides) == (str(ODD), ["train.threads=2"])
    for key in ("split", "out", "data", "recipe"):
        value = keywords.get(key)
        assert getattr(args, key) == (None if value is None else str(value)), key


@pytest.mark.parametrize("keywords", [{}, {"seed": 4, "out": ODD / "labels.json", "labelled": ODD / "before.json"}])
def test_select_round_trip(keywords):
    args = label_selection.parse_args(label_selection.build_argv(ODD, budget=50, strategy="typiclust", **keywords))
    assert (args.embeddings, args.budget, args.strategy, args.seed) == (ODD, 50, "typiclust", keywords.get("seed", 0))
    assert (args.out, args.labelled) == (keywords.get("out"), keywords.get("labelled"))
