"""The README's "Use the trained encoder" runs as written: its commands train the quick start (and its ViT) and
export them, in a fresh directory, with two optimizer steps instead of the recipe's schedule; its Python snippets,
in order in one namespace, load the exports back, and the features each gives are the run's own (its evaluation
transform, then its trained backbone)."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest
import torch

from sslkit.augment import EvalTransform
from sslkit.datasets import build_dataset
from sslkit.evaluation.encoder import load_trained_backbone

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"sslkit-pretrain": "sslkit.cli.pretrain", "sslkit-export": "sslkit.cli.export"}
# A short run: what is tested is the export and the snippets, not the training.
SHORT = ["train.max_steps=2", "train.threads=1", "eval.linear_epochs=0"]
SHORT += ["eval.compare_random_init=false", "eval.compare_raw_pixels=false"]


def section_blocks(language: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("**Use the trained encoder.**") : text.index("**Choosing a backbone.**")]
    return re.findall(rf"^```{language}\n(.*?)^```", section, flags=re.S | re.M)


def run_command(line: str, capsys) -> None:
    """The command's own ``main`` on the line's arguments, in this process (the installed names start the same
    ``main``: tests/test_cli.py), from the current directory."""
    words = shlex.split(line, comments=True)
    if not words:
        return
    extra = SHORT if words[0] == "sslkit-pretrain" else []
    code = importlib.import_module(COMMANDS[words[0]]).main([*words[1:], *extra])
    output = capsys.readouterr()
    assert code == 0, f"{line}\n{output.out[-2000:]}\n{output.err[-2000:]}"


def run_features(run_dir: Path, images: torch.Tensor) -> torch.Tensor:
    cfg, _, backbone = load_trained_backbone(run_dir)
    info = build_dataset("digits", "train").info
    evaluation = EvalTransform(cfg.augment.image_size, info.channels, info.mean, info.std, cfg.augment.normalize)
    with torch.no_grad():
        return backbone(evaluation(images))


@pytest.mark.slow
def test_the_readmes_export_commands_and_loading_snippets_run_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for block in section_blocks("bash"):
        for line in block.splitlines():
            run_command(line, capsys)
    blocks = section_blocks("python")
    assert len(blocks) == 4, "the README's loading snippets: sslkit, timm, ONNX Runtime, safetensors"
    namespace: dict = {"__name__": "readme"}
    features = []  # what the first three snippets compute
    for block in blocks:
        exec(compile(block, str(ROOT / "README.md"), "exec", dont_inherit=True), namespace)
        if "features = " in block:
            features.append(torch.as_tensor(namespace["features"]))
    images = namespace["images"]
    assert images.shape == (1797, 1, 8, 8) and images.dtype == torch.uint8
    quickstart, vit = run_features(Path("runs/quickstart"), images), run_features(Path("runs/quickstart-vit"), images)
    assert quickstart.shape == (1797, 128) and vit.shape == (1797, 192)
    for found, expected in zip(features[:3], [quickstart, vit, quickstart], strict=True):
        torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-5)
    # the last snippet rebuilds the network from the file's header: the run's weights
    model, preprocess = namespace["model"].eval(), namespace["preprocess"]
    with torch.no_grad():
        torch.testing.assert_close(model(preprocess(images)), quickstart, rtol=0, atol=0)
