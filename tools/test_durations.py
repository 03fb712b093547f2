"""Write tests/durations.json, each test file's seconds, from a pytest JUnit report.

    python -m pytest -n 3 --dist loadfile --no-loadscope-reorder --junitxml=report.xml
    python tools/test_durations.py report.xml

``tests/conftest.py`` runs the files longest first: pytest-xdist hands each file to the next free
worker in that order, so a long end-to-end file starts early instead of running alone at the end.
A file missing from durations.json counts as instant (it runs last); a stale figure only costs some
balance, never a test.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def file_seconds(report: Path) -> dict[str, float]:
    """``{"tests/test_x.py": seconds}``: every test case's time (setup, call and teardown) summed by file."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ElementTree.parse(report).iter("testcase"):
        module = case.get("classname", "").split(".")
        while module and not module[-1].startswith("test_"):
            module.pop()  # a test class's name after its module's
        seconds["/".join(module) + ".py"] += float(case.get("time", 0))
    return {path: round(total, 1) for path, total in sorted(seconds.items(), key=lambda item: -item[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a JUnit XML report of a whole run (pytest --junitxml)")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "durations.json")
    args = parser.parse_args()
    durations = file_seconds(args.report)
    args.out.write_text(json.dumps(durations, indent=1) + "\n")
    print(f"{args.out}: {len(durations)} files, {sum(durations.values()) / 60:.1f} minutes in all")


if __name__ == "__main__":
    main()
