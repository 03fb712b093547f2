"""Fashion-MNIST from its IDX files, by default where ``apt-get install dataset-fashion-mnist`` puts them.

Hand-written IDX reading: the format is a few bytes of header then raw pixels, and torchvision's
FashionMNIST class insists on its own directory layout (root/FashionMNIST/raw) and on md5-checked
downloads, while the system package installs the bare .gz files.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import torch

from sslkit.datasets.base import DatasetInfo
from sslkit.datasets.memory import ImageTensorDataset
from sslkit.errors import UserError

FASHION_MNIST_ROOT = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
# From the Fashion-MNIST README (zalandoresearch/fashion-mnist), in label order.
FASHION_MNIST_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
_FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file of unsigned bytes (MNIST's format), gzipped or not.

    Format: two zero bytes, a type code (0x08 for unsigned bytes), the number of dimensions,
    then each dimension as a big-endian int32, then the data in C order.
    """
    path = Path(path)
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as error:  # unreadable, not gzip, truncated, corrupt
        raise UserError(f"cannot read {path} ({error}); replace it with an intact copy") from None
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise UserError(
            f"{path} is not an IDX file of unsigned bytes (bad header {data[:4].hex()}); "
            "replace it with an intact copy"
        )
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
    if len(data) != header + int(np.prod(shape)):
        raise UserError(
            f"{path} holds {len(data) - header} bytes of data but its header says {shape}; "
            "replace it with an intact copy"
        )
    # bytes are read-only; copy into a writable array that torch can own
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape).copy()


def _find_idx(root: Path, stem: str) -> Path | None:
    """The IDX file ``stem`` under ``root`` or torchvision's ``root/FashionMNIST/raw``; raw before .gz."""
    for folder in (root, root / "FashionMNIST" / "raw"):
        for name in (stem, stem + ".gz"):
            if (folder / name).is_file():
                return folder / name
    return None


def fashion_mnist(split: str, root: str | None, download: bool, image_size: int | None) -> ImageTensorDataset:
    """Fashion-MNIST from its four IDX files (70k grey 28x28 images, 10 classes)."""
    root_path = Path(root).expanduser() if root else FASHION_MNIST_ROOT
    paths = [_find_idx(root_path, stem) for stem in _FASHION_MNIST_FILES[split]]
    if None in paths:
        missing = [stem for stem, path in zip(_FASHION_MNIST_FILES[split], paths) if path is None]
        raise UserError(
            f"fashion_mnist: {', '.join(missing)}(.gz) not found in {root_path} "
            f"or {root_path / 'FashionMNIST' / 'raw'}; "
            "install them with 'apt-get install dataset-fashion-mnist' "
            "or set data.root to a directory holding the four IDX files"
            + (" (sslkit does not download Fashion-MNIST)" if download else "")
        )
    images, labels = (read_idx(path) for path in paths)
    if images.ndim != 3 or labels.shape != (len(images),):
        raise UserError(
            f"fashion_mnist: {paths[0]} holds images {images.shape} but {paths[1]} labels {labels.shape}; "
            f"they must be (N, 28, 28) and (N,)"
        )
    info = DatasetInfo(1, images.shape[1], 10, FASHION_MNIST_MEAN, FASHION_MNIST_STD)
    return ImageTensorDataset(
        torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels.astype(np.int64)), FASHION_MNIST_CLASSES, info
    )
