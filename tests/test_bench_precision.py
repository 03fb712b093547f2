"""tools/bench/precision.py times the loop's step and the backbone alone in fp32 and in bf16 autocast."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tools.bench as a namespace package: its module names stay out of the top level

from tools.bench import precision  # noqa: E402


def test_bf16_autocasts_a_convolution_and_fp32_leaves_it_alone():
    conv, images = torch.nn.Conv2d(1, 4, 3), torch.randn(2, 1, 8, 8)
    with precision.autocast("bf16", images.device):
        assert conv(images).dtype == torch.bfloat16
    with precision.autocast("fp32", images.device):
        assert conv(images).dtype == torch.float32


@pytest.mark.slow
def test_quick_run_times_step_and_backbone_in_both_precisions(tmp_path):
    out = tmp_path / "precision.json"
    assert precision.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    median = result["median_s"]
    for p in precision.PRECISIONS:
        assert median[f"step_{p}"] > 0 and median[f"backbone_{p}"] > 0
        assert result["images_per_s"][p] == pytest.approx(result["batch_size"] / median[f"step_{p}"])
    assert result["speedup"] == pytest.approx(median["step_fp32"] / median["step_bf16"])
    assert set(result["cpu_bf16_flags"]) <= set(precision.BF16_FLAGS)
