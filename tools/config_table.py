"""Write docs/config.md: every recipe key with its type, default and meaning.

Generated from the dataclasses of :mod:`sslkit.config` and each method's options dataclass
(``Method.Options`` in :mod:`sslkit.methods`): the type from each field's annotation, the default
from the field, the meaning from the ``Attributes:`` section of the dataclass's docstring
(:func:`sslkit.config.field_docs`), so the reference cannot drift from the code
(``tests/test_docs.py`` checks that the committed file is up to date and that every field has
an entry).

    python tools/config_table.py            # rewrite docs/config.md
    python tools/config_table.py --check    # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from sslkit import config, methods

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"
ROLE = re.compile(r":(?:mod|class|func|meth|attr):`~?([^`]+)`")


def type_name(tp: Any) -> str:
    """An annotation as it reads in the code: ``str | None``, ``tuple[float, float]``, ``dict[str, Any]``."""
    if isinstance(tp, str):
        return tp
    if tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is typing.Literal:
        return " | ".join(repr(arg) for arg in args)
    if origin is not None:
        name = getattr(origin, "__name__", None) or str(origin).replace("typing.", "")
        return f"{name}[{', '.join(type_name(arg) for arg in args)}]" if args else name
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def yaml_value(value: Any) -> str:
    """A default as a recipe would write it: ``null``, ``true``, ``[0.08, 1.0]``, ``{}``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {yaml_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, str):
        return value if value else '""'
    return repr(value)


def default_of(item: dataclasses.Field) -> Any:
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return dataclasses.MISSING


def markdown(text: str) -> str:
    """Docstring markup as Markdown: ``:mod:`x```, ``:class:`x``` and double backquotes become `x`."""
    return ROLE.sub(r"`\1`", text).replace("``", "`")


def cell(text: str) -> str:
    """Table-cell text: one line, with ``|`` escaped (also inside code spans, as GitHub reads tables)."""
    return " ".join(markdown(text).split()).replace("|", "\\|")


def section_table(section: str, cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    docs = config.field_docs(cls)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for item in dataclasses.fields(cls):
        default = default_of(item)
        nested = dataclasses.is_dataclass(default)  # a section in a section (eval.data)
        if nested:
            default = dataclasses.asdict(default)
        shown = "required" if default is dataclasses.MISSING else f"`{yaml_value(default)}`"
        meaning = docs.get(item.name, "")
        rows.append(
            f"| `{section}.{item.name}` | `{cell(type_name(hints.get(item.name, item.type)))}` | {cell(shown)} "
            f"| {cell(meaning) or '-'} |"
        )
        if nested:  # then its keys, spelt in full
            rows += section_table(f"{section}.{item.name}", type(getattr(cls(), item.name)))[2:]
    return rows


def method_tables() -> list[str]:
    """One table per registered method with options: the keys beside ``method.name``."""
    out = []
    for name, method in methods.METHODS.items():
        if not dataclasses.fields(method.Options):
            continue
        out += [f"### `method.name: {name}`", ""]
        intro = summary(method.Options)
        if intro:
            out += [intro, ""]
        out += section_table("method", method.Options)
        out.append("")
    bare = [f"`{name}`" for name, method in methods.METHODS.items() if not dataclasses.fields(method.Options)]
    out += [f"{', '.join(bare[:-1])} and {bare[-1]} read no key besides `method.name`.", ""]
    return out


def summary(cls: type) -> str:
    """The docstring before its ``Attributes:`` section, as one paragraph per blank-line block."""
    text = (inspect.getdoc(cls) or "").split("Attributes:")[0].strip()
    return "\n\n".join(" ".join(markdown(block).split()) for block in text.split("\n\n") if block.strip())


def render() -> str:
    out = [
        "# Recipe reference",
        "",
        "Every key a recipe can set, with its type, default and meaning. A recipe is a YAML file with one",
        "section per table below; a key left out takes the default, and any key can be overridden on the",
        "command line as `section.key=value` (the value is read as YAML: `augment.crop_scale=[0.2,1.0]`,",
        "`run.resume=null`). An unknown key or section, a value of the wrong type and an unknown name are",
        "errors that name the key and the file. The loss section's keys other than `name` are the loss's own",
        "arguments, listed per loss in [losses.md](losses.md).",
        "",
        "Generated by `python tools/config_table.py` from the dataclasses in `sslkit/schema/sections.py` and each",
        "method's options dataclass (`Method.Options`), with types and defaults from the fields and meanings from",
        "each dataclass's `Attributes:` docstring.",
        "",
    ]
    sections = config.field_docs(config.Config)
    for item in dataclasses.fields(config.Config):
        cls = type(default_of(item))
        out += [f"## `{item.name}`", ""]
        intro = summary(cls) or sections.get(item.name, "")
        if intro:
            out += [intro, ""]
        out += section_table(item.name, cls)
        out.append("")
        if cls is config.MethodConfig:
            out += method_tables()
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config.md is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not DOC.is_file() or DOC.read_text() != text:
            print(f"{DOC} is out of date: run python tools/config_table.py", file=sys.stderr)
            return 1
        return 0
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
