"""The docs are checked against the code: the loss table in docs/losses.md is generated from it
and must be current, and every ``>>>`` example in the package runs and prints what it says."""

import doctest
import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import sslkit

ROOT = Path(__file__).resolve().parents[1]


def test_loss_table_is_up_to_date():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "loss_table.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_every_registered_loss_is_in_the_readme_or_docs():
    from sslkit.losses import LOSSES

    text = (ROOT / "docs" / "losses.md").read_text()
    for name in LOSSES:
        assert f"`{name}`" in text, name


MODULES = sorted(m.name for m in pkgutil.walk_packages(sslkit.__path__, prefix="sslkit."))


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name):
    """Each module's ``>>>`` examples, as ``python -m doctest`` would run them."""
    module = importlib.import_module(module_name)
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(module, module_name):
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, (
        f"{results.failed} of {results.attempted} examples in {module_name} failed (output above)"
    )


def test_every_registered_loss_has_an_example():
    """The issue's contract: every loss documents its call with a ``>>>`` example."""
    from sslkit.losses import LOSSES

    for name, cls in LOSSES.items():
        docs = [inspect.getdoc(cls) or "", inspect.getmodule(cls).__doc__ or ""]
        assert any(">>>" in doc for doc in docs), f"{name} ({cls.__name__}) has no >>> example"
