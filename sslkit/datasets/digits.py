"""scikit-learn's bundled 8x8 digits: always available offline (the default dataset)."""

from __future__ import annotations

import numpy as np
import torch

from sslkit.datasets.base import DatasetInfo
from sslkit.datasets.memory import ImageTensorDataset


def digits(split: str, root: str | None, download: bool, image_size: int | None) -> ImageTensorDataset:
    """scikit-learn's 1797 8x8 digits, split 80/20, stratified, with a fixed seed."""
    # Imported here: scikit-learn takes a second to import and only this dataset needs it.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    pixels, targets = load_digits(return_X_y=True)  # (1797, 64) in 0..16, (1797,)
    images = torch.from_numpy(np.round(pixels * (255 / 16)).astype(np.uint8).reshape(-1, 1, 8, 8))
    labels = torch.from_numpy(targets.astype(np.int64))
    train_index, test_index = train_test_split(np.arange(len(labels)), test_size=0.2, stratify=targets, random_state=0)
    # Statistics of the training split only, so that the test split does not inform normalisation.
    train_pixels = images[train_index].double() / 255
    info = DatasetInfo(1, 8, 10, (train_pixels.mean().item(),), (train_pixels.std().item(),))
    index = train_index if split == "train" else test_index
    return ImageTensorDataset(images[index], labels[index], [str(d) for d in range(10)], info)
