"""How long the commands take to answer the mistakes users make most: CPU seconds and wall time to the one line.

Each mistake is its installed console script (``sslkit-select``, ``sslkit-pretrain``, ...) run from an empty
working directory, so that ``nowhere`` is nowhere; its CPU time is the child's own, user + system, from
``os.wait4``'s resource usage. The mistakes run ``--runs`` times (default 5) in turn, one run of each after
the other, so that load on the machine hits them all; the median is the figure, against sslkit's target of
one CPU-second, with ``--help`` beside them for comparison. The last row is what every one of these mistakes
cost before the commands checked them ahead of torch: importing the library (``python -c "import
sslkit.config"``).

    python tools/bench/cli_errors.py                       # 5 runs of each, a rich table
    python tools/bench/cli_errors.py --runs 9 --out cli_errors.json
    python tools/bench/cli_errors.py --quick               # one run of each
    git archive HEAD~3 sslkit | tar -x -C /tmp/before      # an older sslkit, for a before-and-after:
    python tools/bench/cli_errors.py --sslkit /tmp/before  # its package first on the commands' path
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host import describe_host, host_line  # noqa: E402

from sslkit.console import print_table  # noqa: E402

TARGET_CPU_S = 1.0

# (the command line, the exit status it should end with)
MISTAKES = [
    (["sslkit-select", "nowhere", "--budget", "5", "--strategy", "typiclust"], 2),
    (["sslkit-pretrain", "nosuchrecipe"], 2),
    (["sslkit-pretrain", "quickstart", "optim.lrr=0.1"], 2),
    (["sslkit-neighbours", "nowhere"], 2),
    (["sslkit-map", "nowhere"], 2),
    (["sslkit-embed", "nowhere"], 2),
    (["sslkit-evaluate", "nowhere"], 2),
    (["sslkit-export", "nowhere"], 2),
    (["sslkit-duplicates", "nowhere", "--threshold", "0.95"], 2),
    (["sslkit-report", "nowhere"], 2),
    (["sslkit-compare", "quickstart", "nosuchrecipe", "--minutes", "1"], 2),
    (["sslkit-select", "--help"], 0),
    (["sslkit-pretrain", "--help"], 0),
]
LIBRARY_IMPORT = ([sys.executable, "-c", "import sslkit.config"], 0)


def script(name: str) -> str:
    """The console script beside this Python (the virtual environment's), else the one on the PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else name


def run_once(argv: list[str], cwd: Path, env: dict[str, str]) -> dict:
    """One run: exit status, the child's CPU seconds (user + system) and wall seconds, and its stderr's lines."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    return {"status": child.returncode, "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall, "stderr": lines}


def measure(runs: int, sslkit: Path | None = None) -> list[dict]:
    """Every mistake ``runs`` times, in turn (with the ``sslkit`` package of that folder, if given); per command
    line its runs and their medians."""
    env = {**os.environ, **({"PYTHONPATH": str(sslkit.resolve())} if sslkit else {})}
    cases = [([script(argv[0]), *argv[1:]], status) for argv, status in MISTAKES] + [LIBRARY_IMPORT]
    names = [" ".join(argv) for argv, _ in MISTAKES] + ['python -c "import sslkit.config"']
    timings: list[list[dict]] = [[] for _ in cases]
    with tempfile.TemporaryDirectory() as empty:
        for _ in range(runs):
            for (argv, _), done in zip(cases, timings):
                done.append(run_once(argv, Path(empty), env))
    rows = []
    for name, (_, expected), done in zip(names, cases, timings):
        rows.append(
            {
                "command": name,
                "expected_status": expected,
                "statuses": sorted({run["status"] for run in done}),
                "stderr_lines": max(len(run["stderr"]) for run in done),
                "first_line": done[0]["stderr"][0] if done[0]["stderr"] else "",
                "cpu_s": [run["cpu_s"] for run in done],
                "wall_s": [run["wall_s"] for run in done],
                "cpu_s_median": statistics.median(run["cpu_s"] for run in done),
                "wall_s_median": statistics.median(run["wall_s"] for run in done),
            }
        )
    return rows


def render(rows: list[dict], runs: int) -> None:
    table = Table(title=f"the one line to a mistake: median of {runs} runs (target {TARGET_CPU_S:g} CPU-s)")
    for column, justify in (("command", "left"), ("exit", "right"), ("lines", "right")):
        table.add_column(column, justify=justify)
    for column in ("CPU s", "CPU s min-max", "wall s", "target"):
        table.add_column(column, justify="right")
    for row in rows:
        status = ",".join(map(str, row["statuses"]))
        if row["statuses"] != [row["expected_status"]]:
            status += f" (expected {row['expected_status']})"
        library = row["command"].startswith("python")
        table.add_row(
            row["command"],
            status,
            "" if row["expected_status"] == 0 else str(row["stderr_lines"]),
            f"{row['cpu_s_median']:.2f}",
            f"{min(row['cpu_s']):.2f}-{max(row['cpu_s']):.2f}",
            f"{row['wall_s_median']:.2f}",
            "" if library else ("met" if row["cpu_s_median"] < TARGET_CPU_S else "MISSED"),
        )
    print_table(table)  # at its own width: a command line cut into four rows does not read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command line (default 5)")
    parser.add_argument("--quick", action="store_true", help="one run of each")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    parser.add_argument(
        "--sslkit", type=Path, help="a folder holding another sslkit package (an older one), run by the commands"
    )
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    console = Console()
    load_before = os.getloadavg()[0]
    rows = measure(runs, args.sslkit)
    result = {
        "runs": runs,
        "sslkit": str(args.sslkit.resolve()) if args.sslkit else None,
        "target_cpu_s": TARGET_CPU_S,
        "rows": rows,
        "host": describe_host(),
        "load_average_1min": [load_before, os.getloadavg()[0]],
    }
    render(rows, runs)
    loads = " -> ".join(f"{load:.1f}" for load in result["load_average_1min"])
    console.print(f"{host_line(result['host'])}; load average (1 min) {loads}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
