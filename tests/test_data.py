"""Datasets and loaders: every format is read from small files that the tests write in the real
on-disk layout (IDX, CIFAR python batches, STL-10 binaries, image folders), plus the real
Fashion-MNIST files when they are installed."""

import collections
import gzip
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sslkit.datasets import DATASETS, DatasetInfo, ImageTensorDataset, build_dataset, build_loader, collate_batch
from sslkit.datasets.folders import ImageFolderDataset
from sslkit.datasets.idx import FASHION_MNIST_CLASSES, FASHION_MNIST_MEAN, FASHION_MNIST_ROOT, FASHION_MNIST_STD
from sslkit.errors import UserError


def _images(n, c, h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(n, c, h, w), dtype=np.uint8)


# --------------------------------------------------------------------------- digits


def test_digits_splits_shapes_and_determinism():
    from sklearn.datasets import load_digits

    train, test = build_dataset("digits", "train"), build_dataset("digits", "test")
    assert (len(train), len(test)) == (1437, 360)  # 80/20 of 1797
    assert train.images.shape == (1437, 1, 8, 8) and train.images.dtype == torch.uint8
    assert train.labels.shape == (1437,) and train.labels.dtype == torch.int64
    assert train.info.channels == 1 and train.info.image_size == 8 and train.info.num_classes == 10
    assert train.info == test.info  # both splits normalise alike
    pixels = train.images.double() / 255
    assert train.info.mean[0] == pytest.approx(pixels.mean().item()) and train.info.std[0] == pytest.approx(
        pixels.std().item()
    )

    again = build_dataset("digits", "train")
    assert torch.equal(again.images, train.images) and torch.equal(again.labels, train.labels)

    # The two splits partition sklearn's digits, scaled from 0..16 to 0..255.
    x, y = load_digits(return_X_y=True)
    expected = collections.Counter(
        (int(label), np.round(row * 255 / 16).astype(np.uint8).tobytes()) for row, label in zip(x, y)
    )
    ours = collections.Counter(
        (int(label), image.numpy().tobytes())
        for split in (train, test)
        for image, label in zip(split.images, split.labels)
    )
    assert ours == expected
    # Stratified: every class is split about 80/20.
    for digit in range(10):
        n_test, n_all = int((test.labels == digit).sum()), int((y == digit).sum())
        assert abs(n_test - 0.2 * n_all) <= 1


def test_digits_are_scikit_learns_split_in_its_order_read_without_importing_it():
    """The stored split is what scikit-learn's stratified split gives, in the order it gives them (the samplers
    shuffle positions, so the order is part of every digits figure), and the file read directly is
    ``load_digits``; building the dataset imports no scikit-learn."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from sslkit.datasets.digits import bundled_digits

    pixels, labels = load_digits(return_X_y=True)
    ours = bundled_digits()
    assert np.array_equal(ours[0], pixels) and np.array_equal(ours[1], labels) and ours[1].dtype.kind == "i"
    train, test = train_test_split(np.arange(len(labels)), test_size=0.2, stratify=labels, random_state=0)
    for split, index in (("train", train), ("test", test)):
        dataset = build_dataset("digits", split)
        assert torch.equal(dataset.labels, torch.from_numpy(labels[index]))
        expected = torch.from_numpy(np.round(pixels[index] * (255 / 16)).astype(np.uint8).reshape(-1, 1, 8, 8))
        assert torch.equal(dataset.images, expected)

    code = "import sys; from sslkit.datasets import build_dataset as b; b('digits'); print('sklearn' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert imported.stdout.strip() == "False", imported.stderr[-2000:]


def test_digits_from_a_scikit_learn_without_the_file_where_it_was(tmp_path, monkeypatch):
    """A scikit-learn that keeps its data elsewhere is asked for the digits (``load_digits``)."""
    import importlib.util
    import types

    from sklearn.datasets import load_digits

    from sslkit.datasets import digits

    elsewhere = types.SimpleNamespace(origin=str(tmp_path / "sklearn" / "__init__.py"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: elsewhere)
    pixels, labels = digits.bundled_digits()
    expected = load_digits(return_X_y=True)
    assert np.array_equal(pixels, expected[0]) and np.array_equal(labels, expected[1])


def test_getitem_returns_one_image_and_a_scalar_label():
    train = build_dataset("digits")
    image, label = train[5]
    assert image.shape == (1, 8, 8) and image.dtype == torch.uint8
    assert label.shape == () and label.dtype == torch.int64 and label == train.labels[5]


# --------------------------------------------------------------------------- Fashion-MNIST


def write_idx(path, array, gz):
    """MNIST's IDX format: 0, 0, type 0x08 (unsigned byte), ndim, big-endian int32 dims, then the bytes."""
    payload = (
        bytes([0, 0, 0x08, array.ndim])
        + struct.pack(f">{array.ndim}i", *array.shape)
        + array.astype(np.uint8).tobytes()
    )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(f"{path}.gz", "wb") as f:
            f.write(payload)
    else:
        Path(path).write_bytes(payload)


def write_fashion_mnist(folder, gz, n_train=12, n_test=5):
    data = {}
    for prefix, n, seed in (("train", n_train, 1), ("t10k", n_test, 2)):
        images = _images(n, 1, 28, 28, seed)[:, 0]
        labels = np.arange(n) % 10
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images, gz)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels, gz)
        data[prefix] = images, labels
    return data


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("torchvision_layout", [False, True])
def test_fashion_mnist_from_written_idx_files(tmp_path, gz, torchvision_layout):
    folder = tmp_path / "FashionMNIST" / "raw" if torchvision_layout else tmp_path
    written = write_fashion_mnist(folder, gz)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        dataset = build_dataset("fashion_mnist", split, root=str(tmp_path))
        images, labels = written[prefix]
        assert dataset.images.shape == (len(images), 1, 28, 28) and dataset.images.dtype == torch.uint8
        assert torch.equal(dataset.images[:, 0], torch.from_numpy(images))
        assert torch.equal(dataset.labels, torch.from_numpy(labels.astype(np.int64)))
    assert dataset.classes == FASHION_MNIST_CLASSES and dataset.info.num_classes == 10


def test_fashion_mnist_missing_files_say_where_and_how(tmp_path):
    with pytest.raises(UserError, match="apt-get install dataset-fashion-mnist") as error:
        build_dataset("fashion_mnist", root=str(tmp_path))
    assert str(tmp_path) in str(error.value) and "train-images-idx3-ubyte" in str(error.value)


@pytest.mark.parametrize("damage", ["truncated_gzip", "short_data", "bad_magic"])
def test_fashion_mnist_damaged_file_names_it(tmp_path, damage):
    write_fashion_mnist(tmp_path, gz=True)
    target = tmp_path / "train-images-idx3-ubyte.gz"
    if damage == "truncated_gzip":
        target.write_bytes(target.read_bytes()[:200])
    else:
        raw = gzip.decompress(target.read_bytes())
        raw = raw[:-10] if damage == "short_data" else b"\x00\x00\x0b\x03" + raw[4:]
        target.write_bytes(gzip.compress(raw))
    with pytest.raises(UserError, match="train-images-idx3-ubyte.gz"):
        build_dataset("fashion_mnist", root=str(tmp_path))


@pytest.mark.skipif(
    not (FASHION_MNIST_ROOT / "train-images-idx3-ubyte.gz").is_file(), reason="Fashion-MNIST is not installed"
)
def test_fashion_mnist_real_files():
    train, test = build_dataset("fashion_mnist", "train"), build_dataset("fashion_mnist", "test")
    assert train.images.shape == (60000, 1, 28, 28) and test.images.shape == (10000, 1, 28, 28)
    assert torch.equal(torch.bincount(train.labels), torch.full((10,), 6000))
    pixels = train.images.float() / 255
    # The published statistics we normalise with are those of these files.
    assert pixels.mean().item() == pytest.approx(FASHION_MNIST_MEAN[0], abs=1e-4)
    assert pixels.std().item() == pytest.approx(FASHION_MNIST_STD[0], abs=1e-4)


# --------------------------------------------------------------------------- CIFAR


def write_cifar10(root, per_batch=3):
    """cifar-10-batches-py: data_batch_1..5 and test_batch ({data: (n, 3072) uint8, labels: [int]}), batches.meta."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    written = {"train": ([], []), "test": ([], [])}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for seed, name in enumerate(names):
        images = _images(per_batch, 3, 32, 32, seed)
        labels = [(seed + i) % 10 for i in range(per_batch)]
        batch = {
            "batch_label": f"{name} of 6",
            "labels": labels,
            "data": images.reshape(per_batch, 3072),
            "filenames": [f"img_{seed}_{i}.png" for i in range(per_batch)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        split = "test" if name == "test_batch" else "train"
        written[split][0].append(images)
        written[split][1].extend(labels)
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    meta = {"num_cases_per_batch": per_batch, "label_names": classes, "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return {split: (np.concatenate(images), labels) for split, (images, labels) in written.items()}, classes


def write_cifar100(root, n_train=7, n_test=4):
    """cifar-100-python: train and test ({data, fine_labels, coarse_labels, filenames}), meta."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    written = {}
    for seed, (name, n) in enumerate((("train", n_train), ("test", n_test))):
        images = _images(n, 3, 32, 32, 10 + seed)
        fine = [(7 * i + seed) % 100 for i in range(n)]
        batch = {
            "filenames": [f"{i}.png" for i in range(n)],
            "batch_label": name,
            "fine_labels": fine,
            "coarse_labels": [f // 5 for f in fine],
            "data": images.reshape(n, 3072),
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        written[name] = images, fine
    classes = [f"class_{i:02d}" for i in range(100)]
    (folder / "meta").write_bytes(
        pickle.dumps({"fine_label_names": classes, "coarse_label_names": [f"super_{i}" for i in range(20)]})
    )
    return written, classes


def test_cifar10_from_written_batches(tmp_path):
    written, classes = write_cifar10(tmp_path)
    for split in ("train", "test"):
        dataset = build_dataset("cifar10", split, root=str(tmp_path))
        images, labels = written[split]
        assert dataset.images.shape == (len(images), 3, 32, 32) and dataset.images.dtype == torch.uint8
        assert dataset.images.is_contiguous()
        assert torch.equal(dataset.images, torch.from_numpy(images))
        assert dataset.labels.tolist() == labels and dataset.labels.dtype == torch.int64
    assert len(dataset) == 3 and len(build_dataset("cifar10", root=str(tmp_path))) == 15
    assert dataset.classes == classes
    assert (dataset.info.channels, dataset.info.image_size, dataset.info.num_classes) == (3, 32, 10)


def test_cifar100_from_written_batches(tmp_path):
    written, classes = write_cifar100(tmp_path)
    for split in ("train", "test"):
        dataset = build_dataset("cifar100", split, root=str(tmp_path))
        images, fine = written[split]
        assert torch.equal(dataset.images, torch.from_numpy(images))
        assert dataset.labels.tolist() == fine
    assert dataset.classes == classes and dataset.info.num_classes == 100


def test_cifar_missing_files_say_where_and_how(tmp_path):
    with pytest.raises(UserError, match="data.download=true") as error:
        build_dataset("cifar10", root=str(tmp_path))
    assert str(tmp_path / "cifar-10-batches-py") in str(error.value)
    # One missing batch is named.
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(UserError, match="data_batch_3"):
        build_dataset("cifar10", "test", root=str(tmp_path))


def test_cifar_damaged_batch_is_a_user_error(tmp_path):
    write_cifar10(tmp_path)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    batch.write_bytes(batch.read_bytes()[:100])
    with pytest.raises(UserError, match="damaged"):
        build_dataset("cifar10", root=str(tmp_path))


# --------------------------------------------------------------------------- STL-10


def write_stl10(root, n_train=3, n_test=2, n_unlabeled=2):
    """stl10_binary: *_X.bin are uint8 images stored column-major per channel, *_y.bin labels 1..10."""
    folder = root / "stl10_binary"
    folder.mkdir(parents=True)
    written = {}
    for seed, (name, n) in enumerate((("train", n_train), ("test", n_test), ("unlabeled", n_unlabeled))):
        images = _images(n, 3, 96, 96, 20 + seed)
        (folder / f"{name}_X.bin").write_bytes(images.transpose(0, 1, 3, 2).tobytes())  # column-major
        labels = None
        if name != "unlabeled":
            labels = (np.arange(n) * 3 + seed) % 10  # 0-based
            (folder / f"{name}_y.bin").write_bytes((labels + 1).astype(np.uint8).tobytes())
        written[name] = images, labels
    classes = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]
    (folder / "class_names.txt").write_text("\n".join(classes) + "\n")
    return written, classes


def test_stl10_from_written_binaries(tmp_path):
    written, classes = write_stl10(tmp_path)
    for split in ("train", "test"):
        dataset = build_dataset("stl10", split, root=str(tmp_path))
        images, labels = written[split]
        assert dataset.images.shape == (len(images), 3, 96, 96) and dataset.images.is_contiguous()
        assert torch.equal(dataset.images, torch.from_numpy(images))
        assert dataset.labels.tolist() == labels.tolist() and dataset.labels.dtype == torch.int64
    assert dataset.classes == classes and dataset.info.image_size == 96

    unlabeled = build_dataset("stl10", "unlabeled", root=str(tmp_path))
    assert torch.equal(unlabeled.images, torch.from_numpy(written["unlabeled"][0]))
    assert unlabeled.labels.tolist() == [-1, -1]
    both = build_dataset("stl10", "train+unlabeled", root=str(tmp_path))
    assert len(both) == 5 and both.labels.tolist() == written["train"][1].tolist() + [-1, -1]


def test_stl10_missing_files_say_where_and_how(tmp_path):
    write_stl10(tmp_path)
    (tmp_path / "stl10_binary" / "unlabeled_X.bin").unlink()
    with pytest.raises(UserError, match="unlabeled_X.bin not found .*data.download=true"):
        build_dataset("stl10", "test", root=str(tmp_path))


# --------------------------------------------------------------------------- image folders


def write_image_folder(root):
    """root/train/{cat,dog}/ and root/test/cat/, PNG and JPEG, of different sizes, plus a non-image file."""
    rng = np.random.default_rng(0)
    cat = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    for path, size, mode in (
        ("train/cat/a.png", 16, "RGB"),
        ("train/cat/b.jpg", 20, "RGB"),
        ("train/dog/c.png", 9, "L"),
        ("test/cat/d.jpeg", 30, "RGB"),
    ):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        pixels = cat if path.endswith("a.png") else rng.integers(0, 256, size=(size, size + 3, 3), dtype=np.uint8)
        Image.fromarray(pixels).convert(mode).save(root / path)
    (root / "train/dog/notes.txt").write_text("not an image")
    return cat


def test_imagefolder_decodes_resizes_and_labels(tmp_path):
    cat = write_image_folder(tmp_path)
    train = build_dataset("imagefolder", "train", root=str(tmp_path), image_size=16)
    assert isinstance(train, ImageFolderDataset) and len(train) == 3  # notes.txt is not listed
    assert train.classes == ["cat", "dog"] and train.labels.tolist() == [0, 0, 1]
    assert train.info.channels == 3 and train.info.image_size == 16 and train.info.num_classes == 2
    for index in range(len(train)):
        image, label = train[index]
        assert image.shape == (3, 16, 16) and image.dtype == torch.uint8 and label.dtype == torch.int64
    assert torch.equal(train[0][0], torch.from_numpy(cat).permute(2, 0, 1))  # a lossless PNG already at size
    grey = train[2][0]
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])  # grey decoded to RGB

    # The test folder lacks 'dog': labels still follow the training classes.
    test = build_dataset("imagefolder", "test", root=str(tmp_path), image_size=16)
    assert test.classes == ["cat", "dog"] and test.labels.tolist() == [0] and test[0][0].shape == (3, 16, 16)

    images, labels = next(iter(build_loader(train, batch_size=3, shuffle=False, drop_last=True)))
    assert images.shape == (3, 3, 16, 16) and labels.tolist() == [0, 0, 1]


def test_imagefolder_without_split_folders_is_the_training_split(tmp_path):
    write_image_folder(tmp_path)
    flat = build_dataset("imagefolder", root=str(tmp_path / "train"), image_size=8)
    assert flat.classes == ["cat", "dog"] and len(flat) == 3
    with pytest.raises(UserError, match="no test split"):
        build_dataset("imagefolder", "test", root=str(tmp_path / "train"), image_size=8)


def test_imagefolder_resized_lists_and_decodes_as_the_folder_reader_does(tmp_path):
    write_image_folder(tmp_path)
    Image.new("RGB", (5, 7), (10, 20, 30)).save(tmp_path / "train" / "dog" / "e.BMP")  # Pillow decodes it
    (tmp_path / "train" / ".thumbs").mkdir()  # hidden: not a class
    resized = build_dataset("imagefolder", root=str(tmp_path), image_size=8)
    files = build_dataset("imagefolder", root=str(tmp_path))
    assert [path for path, _ in resized.samples] == [str(path) for path in files.paths]
    assert resized.classes == files.classes == ["cat", "dog"] and resized.labels.tolist() == files.labels.tolist()
    assert resized[3][0].shape == (3, 8, 8) and resized[3][0][:, 0, 0].tolist() == [10, 20, 30]


def test_imagefolder_corrupt_image_is_a_one_line_error_naming_it(tmp_path):
    write_image_folder(tmp_path)
    bad = tmp_path / "train" / "dog" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n this is not a png")
    dataset = build_dataset("imagefolder", root=str(tmp_path), image_size=8)  # listing does not decode
    index = [path for path, _ in dataset.samples].index(str(bad))
    with pytest.raises(UserError) as error:
        dataset[index]
    message = str(error.value)
    assert str(bad) in message and "remove or fix" in message and "\n" not in message and ".cpp" not in message
    with pytest.raises(UserError, match="broken.png"):
        list(build_loader(dataset, batch_size=2, shuffle=False, drop_last=False))


def test_imagefolder_needs_root_and_without_image_size_keeps_sizes(tmp_path):
    with pytest.raises(UserError, match="data.root"):
        build_dataset("imagefolder", image_size=32)
    write_image_folder(tmp_path)
    images, labels = build_dataset("imagefolder", root=str(tmp_path)).__getitems__([0, 1, 2])
    assert images.sizes.tolist() == [[16, 16], [20, 23], [9, 12]] and labels.tolist() == [0, 0, 1]
    (tmp_path / "test" / "bird").mkdir()
    with pytest.raises(UserError, match="bird"):
        build_dataset("imagefolder", "test", root=str(tmp_path), image_size=8)


# --------------------------------------------------------------------------- names and splits


def test_unknown_names_and_splits_list_the_choices():
    with pytest.raises(UserError) as error:
        build_dataset("mnist")
    assert all(name in str(error.value) for name in DATASETS)
    with pytest.raises(UserError, match="train, test"):
        build_dataset("digits", "val")
    with pytest.raises(UserError, match="imagefolder only"):
        build_dataset("digits", image_size=32)


# --------------------------------------------------------------------------- loaders


class BatchOnly(ImageTensorDataset):
    """Fails on single-sample access, so a loader can only work through __getitems__."""

    def __getitem__(self, index):
        raise AssertionError("the loader fetched one sample at a time")


def test_loader_fetches_whole_batches_and_is_seeded():
    digits = build_dataset("digits")
    dataset = BatchOnly(digits.images, digits.labels, digits.classes, digits.info)
    loader = build_loader(dataset, batch_size=100, shuffle=True, drop_last=True, seed=3)
    batches = list(loader)
    assert len(batches) == 14  # 1437 // 100
    images, labels = batches[0]
    assert images.shape == (100, 1, 8, 8) and images.dtype == torch.uint8 and labels.shape == (100,)
    # Each (image, label) pair is a real sample of the dataset, none repeated within the epoch.
    seen = collections.Counter(
        (int(label), image.numpy().tobytes())
        for image, label in zip(torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches]))
    )
    everything = collections.Counter(
        (int(label), image.numpy().tobytes()) for image, label in zip(digits.images, digits.labels)
    )
    assert len(seen) == 1400 and not seen - everything
    # The same seed gives the same order, another seed another.
    same = list(build_loader(dataset, batch_size=100, shuffle=True, drop_last=True, seed=3))
    other = list(build_loader(dataset, batch_size=100, shuffle=True, drop_last=True, seed=4))
    assert all(torch.equal(a[1], b[1]) for a, b in zip(batches, same))
    assert not torch.equal(batches[0][1], other[0][1])


def test_loader_with_a_worker_process():
    digits = build_dataset("digits", "test")
    loader = build_loader(digits, batch_size=64, shuffle=False, drop_last=False, num_workers=1)
    images, labels = map(torch.cat, zip(*loader))
    assert torch.equal(images, digits.images) and torch.equal(labels, digits.labels)


def test_collate_batch_stacks_samples_and_passes_batches_through():
    digits = build_dataset("digits", "test")
    images, labels = collate_batch([digits[0], digits[1], digits[2]])
    assert torch.equal(images, digits.images[:3]) and torch.equal(labels, digits.labels[:3])
    batch = digits.__getitems__([4, 2])
    assert collate_batch(batch) is batch


def test_batch_larger_than_dataset_is_a_user_error():
    digits = build_dataset("digits", "test")
    with pytest.raises(UserError, match="train.batch_size 500 is larger than the dataset's 360 training images"):
        build_loader(digits, batch_size=500, shuffle=True, drop_last=True)
    assert len(list(build_loader(digits, batch_size=500, shuffle=False, drop_last=False))) == 1


# --------------------------------------------------------------------------- subsets


def test_select_classes_partitions_and_keeps_labels():
    digits = build_dataset("digits")
    held_out = digits.select_classes([3, 7])
    rest = digits.select_classes([3, 7], keep=False)
    assert set(held_out.labels.tolist()) == {3, 7} and 3 not in rest.labels and 7 not in rest.labels
    assert len(held_out) + len(rest) == len(digits)
    assert held_out.info == digits.info and held_out.classes == digits.classes
    first = int(torch.nonzero(digits.labels == 3)[0])
    assert torch.equal(held_out.images[0], digits.images[first])
    with pytest.raises(UserError, match="class 10 does not exist"):
        digits.select_classes([10])


def test_select_classes_with_unlabelled_samples():
    info = DatasetInfo(channels=3, image_size=2, num_classes=2, mean=(0.5,) * 3, std=(0.2,) * 3)
    dataset = ImageTensorDataset(
        torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.tensor([0, 1, -1, 1]), ["a", "b"], info
    )
    assert dataset.select_classes([1]).labels.tolist() == [1, 1]
    assert dataset.select_classes([1], keep=False).labels.tolist() == [0, -1]


def test_subset_and_imagefolder_select_classes(tmp_path):
    digits = build_dataset("digits", "test")
    part = digits.subset([5, 0, 5])
    assert torch.equal(part.images, digits.images[[5, 0, 5]]) and torch.equal(part.labels, digits.labels[[5, 0, 5]])
    write_image_folder(tmp_path)
    folder = build_dataset("imagefolder", root=str(tmp_path), image_size=8)
    dogs = folder.select_classes([1])
    assert dogs.labels.tolist() == [1] and dogs.samples[0][0].endswith("c.png") and dogs[0][0].shape == (3, 8, 8)
