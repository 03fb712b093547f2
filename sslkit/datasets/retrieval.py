"""The metric-learning retrieval benchmarks, read from the files as their archives unpack.

Each is split by class, as the papers evaluate them (Song et al. 2016, https://arxiv.org/abs/1511.06452;
Liu et al. 2016 for In-shop): the network trains on one half of the classes and is evaluated by
retrieval among the images of the other half, classes it never saw. ``data.root`` is the folder
the archive unpacked to (or the folder above it):

- ``cub200`` (CUB-200-2011): ``images.txt`` (``<id> <path under images/>``),
  ``image_class_labels.txt`` (``<id> <class 1..200>``), ``classes.txt``; classes 1-100 train,
  101-200 test.
- ``cars196`` (Stanford Cars): ``cars_annos.mat`` (its ``annotations``: ``relative_im_path``
  ``car_ims/000001.jpg`` and ``class`` 1..196; ``class_names``); classes 1-98 train, 99-196 test.
  Its own ``test`` flag (a split within each class) is not used.
- ``sop`` (Stanford Online Products): ``Ebay_train.txt`` and ``Ebay_test.txt``, each with the header
  ``image_id class_id super_class_id path``; 11,318 training classes, 11,316 test classes.
- ``inshop`` (DeepFashion In-shop Clothes Retrieval): ``list_eval_partition.txt`` (a count, the header
  ``image_name item_id evaluation_status``, then ``img/... id_00000001 train|query|gallery``), in
  ``root`` or ``root/Eval``, the images under ``root`` or ``root/Img``; splits ``train``,
  ``query`` and ``gallery`` (the test items, retrieved from the gallery by the queries).

Labels are ``0 .. C - 1`` within each split (the test classes numbered apart from the training
ones). Images keep their own size (reduced to ``data.max_size``), as in :func:`.folders.image_folder`.

>>> cub200("train", "/nonexistent")  # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
sslkit.errors.UserError: cub200: images.txt not found in /nonexistent or /nonexistent/CUB_200_2011; ...
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sslkit.datasets.folders import ImageFiles
from sslkit.errors import UserError


def _find(name: str, root: str | None, file: str, below: tuple[str, ...]) -> Path:
    """The folder under ``root`` (``root`` itself or one of ``below``) that holds ``file``."""
    if root is None:
        raise UserError(f"{name} needs data.root: the folder its archive unpacked to (the one holding {file})")
    base = Path(root).expanduser()
    folders = [base, *(base / sub for sub in below)]
    for folder in folders:
        if (folder / file).is_file():
            return folder
    raise UserError(
        f"{name}: {file} not found in {' or '.join(str(f) for f in folders)}; set data.root to the folder it is in"
    )


def _rows(path: Path, columns: int, header: int = 0) -> list[list[str]]:
    """The whitespace-separated rows of a list file, after ``header`` lines, each with ``columns`` fields."""
    lines = [line.split() for line in path.read_text().splitlines()[header:] if line.strip()]
    bad = next((i for i, fields in enumerate(lines) if len(fields) != columns), None)
    if bad is not None:
        raise UserError(
            f"{path}: line {bad + header + 1} has {len(lines[bad])} fields, not {columns}; "
            f"replace it with an intact copy"
        )
    return lines


def _image_files(name: str, paths: list[Path], labels: list[int], classes: list[str], max_size) -> ImageFiles:
    """The listed images; the first is looked for on disk (a stat per image would be slow on SOP's 120k)."""
    if paths and not paths[0].is_file():
        raise UserError(
            f"{name}: image {paths[0]} is missing; set data.root to the folder the list's paths start from"
        )
    return ImageFiles(paths, torch.tensor(labels, dtype=torch.int64), classes, max_size)


def _by_class(
    name: str, folder: Path, paths: list[str], numbers: list[int], keep, max_size, names: dict | None = None
) -> ImageFiles:
    """The images whose class number ``keep`` accepts, labelled by the rank of their class among those kept."""
    kept = sorted({c for c in numbers if keep(c)})
    label = {c: i for i, c in enumerate(kept)}
    chosen = [(folder / path, label[c]) for path, c in zip(paths, numbers) if c in label]
    classes = [(names or {}).get(c, str(c)) for c in kept]
    return _image_files(name, [path for path, _ in chosen], [c for _, c in chosen], classes, max_size)


def cub200(split: str, root: str | None, max_size: int | None = None) -> ImageFiles:
    """CUB-200-2011: classes 1-100 are ``train``, 101-200 ``test``."""
    folder = _find("cub200", root, "images.txt", ("CUB_200_2011",))
    images = dict(_rows(folder / "images.txt", 2))
    numbers = {i: int(c) for i, c in _rows(folder / "image_class_labels.txt", 2)}
    names = {int(c): n for c, n in _rows(folder / "classes.txt", 2)} if (folder / "classes.txt").is_file() else {}
    ids = sorted(images, key=int)
    keep = (lambda c: c <= 100) if split == "train" else (lambda c: c > 100)
    paths, classes = [images[i] for i in ids], [numbers[i] for i in ids]
    return _by_class("cub200", folder / "images", paths, classes, keep, max_size, names)


def cars196(split: str, root: str | None, max_size: int | None = None) -> ImageFiles:
    """Stanford Cars from ``cars_annos.mat``: classes 1-98 are ``train``, 99-196 ``test``."""
    # Only this dataset needs scipy.
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    folder = _find("cars196", root, "cars_annos.mat", ())
    try:
        annotations = np.atleast_1d(loadmat(str(folder / "cars_annos.mat"), squeeze_me=True)["annotations"])
        paths = [str(p) for p in annotations["relative_im_path"]]
        numbers = [int(c) for c in annotations["class"]]
    except (OSError, ValueError, KeyError, MatReadError) as error:
        raise UserError(
            f"cars196: cannot read {folder / 'cars_annos.mat'} ({error}); replace it with an intact copy"
        ) from None
    keep = (lambda c: c <= 98) if split == "train" else (lambda c: c > 98)
    return _by_class("cars196", folder, paths, numbers, keep, max_size)


def sop(split: str, root: str | None, max_size: int | None = None) -> ImageFiles:
    """Stanford Online Products: ``Ebay_train.txt`` is ``train``, ``Ebay_test.txt`` ``test``."""
    file = "Ebay_train.txt" if split == "train" else "Ebay_test.txt"
    folder = _find("sop", root, file, ("Stanford_Online_Products",))
    rows = _rows(folder / file, 4, header=1)  # image_id class_id super_class_id path
    return _by_class("sop", folder, [r[3] for r in rows], [int(r[1]) for r in rows], lambda c: True, max_size)


def inshop(split: str, root: str | None, max_size: int | None = None) -> ImageFiles:
    """In-shop Clothes Retrieval: ``train`` items, and the test items' ``query`` and ``gallery`` images.

    The query and gallery images of one item get the same label (items numbered over both).
    """
    folder = _find("inshop", root, "list_eval_partition.txt", ("Eval",))
    rows = _rows(folder / "list_eval_partition.txt", 3, header=2)  # image_name item_id evaluation_status
    base = Path(root).expanduser()
    images = base / "Img" if (base / "Img").is_dir() else base
    wanted = ("train",) if split == "train" else ("query", "gallery")
    items = sorted({item for _, item, status in rows if status in wanted})
    label = {item: i for i, item in enumerate(items)}
    chosen = [(images / path, label[item]) for path, item, status in rows if status == split]
    return _image_files("inshop", [path for path, _ in chosen], [c for _, c in chosen], items, max_size)


# data.name -> reader, and each one's splits.
READERS = {"cub200": cub200, "cars196": cars196, "sop": sop, "inshop": inshop}
SPLITS = {"cub200": ("train", "test"), "cars196": ("train", "test"), "sop": ("train", "test")}
SPLITS["inshop"] = ("train", "query", "gallery")
