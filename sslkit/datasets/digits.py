"""scikit-learn's bundled 8x8 digits: always available offline (the default dataset).

The images come from scikit-learn's own file (``sklearn/datasets/data/digits.csv.gz``, what
``sklearn.datasets.load_digits`` reads), read here without importing scikit-learn: the import takes
about a second, in every process that trains or evaluates on the digits, and nothing else of it is
needed. The split is scikit-learn's stratified 80/20 split with a fixed seed, kept as the indices it
gives (``digits_split.json``, which says how they were made; a test checks them against scikit-learn).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch

from sslkit.datasets.base import DatasetInfo
from sslkit.datasets.memory import ImageTensorDataset

SPLIT_FILE = Path(__file__).with_name("digits_split.json")


def bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1797 digits as ``(pixels, labels)``: (1797, 64) in 0..16 and (1797,), as ``load_digits``
    returns them."""
    package = importlib.util.find_spec("sklearn")  # finds the installed package without importing it
    data_file = Path(package.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if not data_file.is_file():  # a scikit-learn that keeps its data elsewhere: ask it
        from sklearn.datasets import load_digits

        return load_digits(return_X_y=True)
    with gzip.open(data_file, "rt") as rows:
        table = np.loadtxt(rows, delimiter=",")  # 64 pixels, then the label
    return table[:, :-1], table[:, -1].astype(int)


def digits(split: str, root: str | None, download: bool, image_size: int | None) -> ImageTensorDataset:
    """scikit-learn's 1797 8x8 digits, split 80/20, stratified, with a fixed seed."""
    pixels, targets = bundled_digits()
    images = torch.from_numpy(np.round(pixels * (255 / 16)).astype(np.uint8).reshape(-1, 1, 8, 8))
    labels = torch.from_numpy(targets.astype(np.int64))
    indices = json.loads(SPLIT_FILE.read_text())
    train_index = torch.tensor(indices["train"])
    # Statistics of the training split only, so that the test split does not inform normalisation.
    train_pixels = images[train_index].double() / 255
    info = DatasetInfo(1, 8, 10, (train_pixels.mean().item(),), (train_pixels.std().item(),))
    index = train_index if split == "train" else torch.tensor(indices["test"])
    return ImageTensorDataset(images[index], labels[index], [str(d) for d in range(10)], info)
