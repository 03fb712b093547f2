"""The docs are checked against the code: the loss table in docs/losses.md and the recipe reference
in docs/config.md are generated from it and must be current, every recipe key says what it means,
and every ``>>>`` example in the package runs and prints what it says."""

import dataclasses
import doctest
import importlib
import inspect
import pkgutil
import re
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


def test_config_table_is_up_to_date():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "config_table.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def section_classes():
    from sslkit.config import Config

    return {item.name: type(getattr(Config(), item.name)) for item in dataclasses.fields(Config)}


def test_every_recipe_key_says_what_it_means():
    """A key added to a section without an ``Attributes:`` line in its dataclass fails here, not in review."""
    from sslkit.config import Config, field_docs

    classes = {"recipe": Config, **section_classes()}
    for section, cls in classes.items():
        names = [item.name for item in dataclasses.fields(cls)]
        docs = field_docs(cls)
        missing = [name for name in names if not docs.get(name)]
        assert not missing, f"{cls.__name__} ({section}): no Attributes entry for {', '.join(missing)}"
        stale = [name for name in docs if name not in names]
        assert not stale, f"{cls.__name__} ({section}): Attributes entries for no field: {', '.join(stale)}"


def test_the_config_reference_lists_every_key():
    text = (ROOT / "docs" / "config.md").read_text()
    for section, cls in section_classes().items():
        for item in dataclasses.fields(cls):
            assert f"| `{section}.{item.name}` |" in text, f"{section}.{item.name}"


def test_every_method_option_says_what_it_means_under_its_method():
    """Each method's options dataclass documents every field, and docs/config.md lists them under the method."""
    from sslkit.config import field_docs
    from sslkit.methods import METHODS

    text = (ROOT / "docs" / "config.md").read_text()
    for name, method in METHODS.items():
        names = [item.name for item in dataclasses.fields(method.Options)]
        docs = field_docs(method.Options)
        assert sorted(docs) == sorted(names), f"{name}: Attributes {sorted(docs)} for fields {sorted(names)}"
        if names:
            table = text.split(f"### `method.name: {name}`")[1].split("###")[0]
            missing = [key for key in names if f"| `method.{key}` |" not in table]
            assert not missing, f"docs/config.md has no row under method {name} for {', '.join(missing)}"


# What the docs and recipes describe is sslkit and its results; how it was developed lives in git.
HISTORY = re.compile(r"\bsessions?\b|REFERENCE\.md|\bseed 00\d|\.\./shared", re.IGNORECASE)


def test_docs_and_recipes_describe_the_project_not_its_making():
    paths = [ROOT / "README.md", ROOT / "tools" / "bench" / "README.md"]
    paths += sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "sslkit" / "recipes").glob("*.yaml"))
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in paths
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, "\n".join(found)


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


def test_relative_links_and_images_in_the_docs_exist():
    """Every ``[text](path)`` and ``![alt](path)`` in README and docs that is not a web address points at a file
    of the repository (anchors aside)."""
    missing = []
    for page in [ROOT / "README.md", ROOT / "tools" / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+://", path) and not (page.parent / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, "\n".join(missing)


def test_install_hints_are_quoted_for_every_shell():
    """``pip install sslkit[plot]`` fails in zsh (the brackets are a glob): every hint is ``"sslkit[extra]"``."""
    sources = [*(ROOT / "sslkit").rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    unquoted = [
        f"{path.relative_to(ROOT)}: pip install {argument}"
        for path in sources
        for argument in re.findall(r"pip install ([^\s`'\"{]*\[[^\]]*\])", path.read_text())
    ]
    assert not unquoted, unquoted
