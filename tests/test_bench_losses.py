"""tools/bench/losses.py --quick runs end to end in a subprocess and writes the JSON it promises.

Only the shape of the report and the figures that do not depend on timing noise are checked
(a smoke run's ratios at tiny sizes mean nothing).
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BATCH = ["ntxent", "dcl", "supcon"]
HEADS = ["arcface", "cosface", "sphereface", "proxy_nca", "proxy_anchor"]
PAIRWISE = BATCH + ["contrastive", "triplet", "lifted", "npair", "angular", "soft_nn", "circle"]


@pytest.fixture(scope="module")
def bench():
    """tools/bench/losses.py as a module (a script, not part of the package)."""
    sys.path.insert(0, str(ROOT / "tools/bench"))
    try:
        import losses
    finally:
        sys.path.pop(0)
    return losses


def _positive(x):
    return isinstance(x, float) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_quick_run_writes_every_section(tmp_path):
    out = tmp_path / "losses.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools/bench/losses.py"), "--quick", "--threads", "1", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(a) batch losses" in proc.stdout
    report = json.loads(out.read_text())

    assert set(report) == {"meta", "batch_losses", "heads", "pairwise", "pml_ntxent"}
    meta = report["meta"]
    assert meta["quick"] is True and meta["threads"] == 1 and meta["dtype"] == "float32"
    assert {"batch", "heads", "pairwise", "pml_ntxent_sizes"} <= set(meta["sizes"])
    assert meta["memory_method"] != "not measured"

    # Every loss has a row, measured or saying why not (files still landing are "not available").
    assert [r["loss"] for r in report["batch_losses"]] == BATCH + ["supcon, 100 classes"]
    assert [r["loss"] for r in report["heads"]] == HEADS
    assert [r["loss"] for r in report["pairwise"]] == PAIRWISE
    for row in report["batch_losses"] + report["heads"]:
        if row["available"] and "errors" not in row:
            assert all(_positive(row[k]) for k in ("sslkit_over_matmul3", "peer_over_matmul3", "sslkit_over_peer"))
        else:
            assert row.get("note") or row.get("errors")
    for row in report["pairwise"]:
        if "note" not in row:
            assert _positive(row["over_matmul3"]) and row["peak_over_matrix"] >= 0

    # Losses that exist in this repo are measured, and sslkit's NT-Xent equals lightly's.
    ntxent = report["batch_losses"][0]
    assert ntxent["available"] and ntxent["abs_value_diff_vs_peer"] < 1e-4
    for row in report["heads"][3:]:
        assert row["available"] and _positive(row["sslkit_over_peer"])
    assert "note" not in report["pairwise"][0]

    assert report["pml_ntxent"] and report["pml_ntxent"][0]["survived"]
    assert report["pml_ntxent"][0]["pml_peak_over_matrix"] >= 0


def test_ratios_pair_the_times_of_each_repeat(bench):
    """A machine that slows down mid-run (second repeat 10x slower for everyone) leaves a paired
    ratio untouched, where the ratio of medians would mix fast and slow repeats."""
    times = bench.Timings({"loss": [1.2, 12.0, 12.0], "matmul3": [1.0, 10.0, 10.0]})
    assert times.ratio("loss", "matmul3") == pytest.approx(1.2)
    assert times["loss"] == 12.0 and times["matmul3"] == 10.0  # the medians stay available
    assert times.ratio("loss", "peer") is None


def test_every_candidate_is_timed_each_repeat_in_a_varying_order(bench):
    calls = []
    steps = {name: (lambda name=name: calls.append(name) or 0.0) for name in ("matmul3", "sslkit", "peer")}
    times, values, errors = bench.median_times(steps, repeats=20)
    timed = calls[3:]  # after one warm-up call each
    assert len(timed) == 60 and all(len(times.samples[n]) == 20 for n in steps)
    orders = {tuple(timed[i : i + 3]) for i in range(0, 60, 3)}
    assert len(orders) > 1 and all(sorted(o) == sorted(steps) for o in orders)
    assert values == {"matmul3": 0.0, "sslkit": 0.0, "peer": 0.0} and errors == {}


def test_a_block_times_consecutive_calls_and_records_the_time_per_call(bench, monkeypatch):
    # The steps advance a clock of the test's own rather than sleeping: a sleep on a busy machine oversleeps by
    # milliseconds, which would change the block's length that is tested here.
    clock, calls = [0.0], []
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])

    def step(name, seconds):
        def run():
            calls.append(name)
            clock[0] += seconds
            return 0.0

        return run

    steps = {"short": step("short", 0.002), "long": step("long", 0.03)}
    times, _, _ = bench.median_times(steps, repeats=3, block_s=0.02)
    # two warm-up calls each (the second sets the block), then blocks: 10 short calls, 1 long, in every repeat
    timed = calls[4:]
    assert timed.count("long") == 3 and timed.count("short") == 3 * 10
    assert times["short"] == pytest.approx(0.002) and times["long"] == pytest.approx(0.03)  # per call, not block


@pytest.mark.slow
def test_head_floor_quick_run_reports_every_head_against_both_baselines(tmp_path):
    """tools/bench/head_floor.py --quick: every candidate against the matmuls, each margin head
    against the aten floor, in every round, and the same figures in its JSON."""
    out = tmp_path / "head_floor.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools/bench/head_floor.py"),
            "--quick",
            "--rounds",
            "2",
            "--threads",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "aten floor" in proc.stdout
    report = json.loads(out.read_text())
    assert len(report["rounds"]) == 2
    for figures in report["rounds"]:
        assert set(figures["over_matmul3"]) == {"aten floor", "arcface", "cosface", "sphereface"}
        assert set(figures["over_floor"]) == {"arcface", "cosface", "sphereface"}
        assert all(_positive(v) for v in [*figures["over_matmul3"].values(), *figures["over_floor"].values()])
