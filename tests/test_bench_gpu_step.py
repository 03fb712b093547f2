"""tools/bench/gpu_step.py runs anywhere in its smoke mode, counts a step's FLOPs, and knows each GPU's peak."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tools.bench as a namespace package: its module names stay out of the top level

from tools.bench import gpu_step  # noqa: E402


@pytest.mark.slow
def test_quick_run_times_both_models_and_counts_their_flops(tmp_path):
    # Its own process: the benchmark's bf16 Accelerator would fix this process's Accelerate state.
    command = [
        sys.executable,
        str(ROOT / "tools" / "bench" / "gpu_step.py"),
        "--quick",
        "--out",
        str(tmp_path / "g.json"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads((tmp_path / "g.json").read_text())
    assert [r["model"] for r in results] == ["resnet18-cifar", "vit-s16"]
    for r in results:
        assert r["images_per_s"] > 0 and r["median_step_s"] > 0
        # forward and backward of two views of 8 images: more than the forward of one image alone
        assert r["flops_per_step"] > 1e6
        assert r["mfu"] is None  # the CPU has no bf16 peak in the table


def test_the_peak_is_the_named_gpus():
    assert gpu_step.peak_of("NVIDIA H100 80GB HBM3") == gpu_step.peak_of("NVIDIA H200") == 989e12
    assert gpu_step.peak_of("NVIDIA L40S") == 362e12 and gpu_step.peak_of("NVIDIA L4") == 121e12
    assert gpu_step.peak_of("Some other accelerator") is None
