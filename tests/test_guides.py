"""The guides' code runs: the ```python blocks of docs/add-a-loss.md and docs/add-a-method.md, in
order, in one namespace per guide, so a guide that goes stale fails here. The loss the loss guide
writes is also put through the checks every registered loss passes (tests/test_loss_common.py)."""

from __future__ import annotations

import doctest
import importlib.util
import re
from pathlib import Path

import pytest
import test_loss_common as common

from sslkit import losses, methods

DOCS = Path(__file__).resolve().parents[1] / "docs"


def run_guide(name: str) -> dict:
    """Execute the guide's ```python blocks; return the namespace they share."""
    text = (DOCS / name).read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) >= 2, f"docs/{name} has no code to run"
    namespace: dict = {"__name__": name.replace("-", "_").removesuffix(".md")}
    for block in blocks:
        # As a reader runs it: without this file's "from __future__ import annotations" (dataclasses would then
        # look the guide up in sys.modules). Tracebacks point at the guide.
        exec(compile(block, str(DOCS / name), "exec", dont_inherit=True), namespace)
    return namespace


def test_add_a_loss_guide_runs_and_its_loss_passes_the_registry_checks(monkeypatch):
    guide = run_guide("add-a-loss.md")
    loss_cls = guide["AlignUniformLoss"]
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(loss_cls, globs=guide):
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
    # Registered as the guide's diff registers it, for the single-process checks of every loss.
    name = "align_uniform"
    monkeypatch.setitem(losses.LOSSES, name, loss_cls)
    monkeypatch.setitem(losses.KIND, name, "two_view")
    common.test_every_loss_names_an_input_that_is_not_a_tensor(name)
    common.test_two_view_losses_refuse_an_integer_bank_as_they_refuse_integer_views(name)
    common.test_two_view_losses_take_views_of_different_float_dtypes(name)
    common.test_build_names_an_unknown_argument_and_lists_the_valid_ones(name)
    common.test_every_switch_refuses_a_word_and_takes_true_and_false(name, "gather_distributed")
    for value in (None, "abc", [1.0], float("nan"), float("inf"), -1.0):
        common.test_every_numeric_argument_that_is_not_a_valid_number_is_named(name, value)
    for case in common._EXTREME_BATCHES:
        common.test_every_loss_stays_finite_on_extreme_but_valid_batches(name, case)
    for layout in common._STRIDED:
        common.test_every_loss_gives_the_same_value_and_gradients_for_non_contiguous_embeddings(name, layout)


def test_add_a_method_guide_runs(monkeypatch):
    monkeypatch.setattr(methods, "METHODS", dict(methods.METHODS))  # the guide registers its method
    guide = run_guide("add-a-method.md")
    assert methods.METHODS["simclr_no_head"] is guide["SimCLRNoHead"]
    # Registered, its options get their table in the recipe reference.
    spec = importlib.util.spec_from_file_location("config_table", DOCS.parent / "tools" / "config_table.py")
    config_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(config_table)
    table = config_table.render().split("### `method.name: simclr_no_head`")[1].split("###")[0]
    assert "| `method.feature_dropout` | `float` | `0.0` | Dropout on the backbone's features" in table


@pytest.mark.parametrize("name", ["add-a-loss.md", "add-a-method.md"])
def test_guides_name_only_code_that_exists(name):
    """The paths and names a guide tells the reader to edit are the package's own."""
    text = (DOCS / name).read_text()
    for path in re.findall(r"`((?:sslkit|tests|tools)/[\w/.]+\.py)`", text):
        new = path.endswith(("align_uniform.py", "simclr_no_head.py"))
        assert new or (DOCS.parent / path).is_file(), path
    assert "BY_KIND" in text or "METHODS" in text
