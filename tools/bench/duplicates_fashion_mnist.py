"""Near-duplicates on Fashion-MNIST: copies injected into the test set found by SemDeDup, and the test images
with a near-copy in the training set.

The set: the 10,000 test images and ``--copies-per-kind`` copies of other test images of each
kind: ``exact``, ``shift`` (2 pixels in a random direction, zeros filled in), ``jpeg`` (a JPEG
round trip at quality 75) and ``brightness`` (pixel values x 0.7 or x 1.3, clipped). Each copy and
its source are an *injected pair*.

For each threshold, :func:`sslkit.embeddings.semdedup` groups the set (default clusters: one per
1,000 items) and every pair of items in one group counts as found:

- precision: the found pairs that are injected pairs, over all found pairs (pairs of original
  test images count against it, though some are near-duplicates indeed);
- recall: the injected pairs found, over all of them, and per kind;
- ``pairs >= T``: the injected pairs whose similarity is at least T (what comparing every pair
  finds); SemDeDup's recall is lower where k-means split a pair or a group kept them apart;
- ``split``: of every pair of the set at similarity >= T (all of them, exact), the share whose two
  items k-means put in different clusters, which SemDeDup cannot find.

Then each original test image's nearest training image (:func:`sslkit.embeddings.near_copies`):
how many are at least T similar for several T, and a picture of the closest pairs.

Embeddings, one of:

    # a run's encoder, embedded here (the backbone's pooled features, the run's evaluation transform)
    python tools/bench/duplicates_fashion_mnist.py --run runs/fashion-mnist-simclr --work /tmp/fm-dups
    # embeddings folders written by sslkit-embed: first the images, then the two folders
    python tools/bench/duplicates_fashion_mnist.py --write-images /tmp/fm-dups/images
    sslkit-embed RUN --data /tmp/fm-dups/images --out /tmp/fm-dups/test-with-copies
    sslkit-embed RUN --data fashion_mnist --split train --out /tmp/fm-dups/train
    python tools/bench/duplicates_fashion_mnist.py --embeddings /tmp/fm-dups/test-with-copies \\
        --train-embeddings /tmp/fm-dups/train
    # no encoder: raw pixels, flattened and L2-normalised (a floor, labelled as such)
    python tools/bench/duplicates_fashion_mnist.py --pixels --work /tmp/fm-dups

Items name their image: ``test-01234.png`` an original test image, ``copy-<kind>-01234.png`` a
copy of test image 1234; a training item's number is its index in the training set.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from rich.console import Console
from rich.table import Table

KINDS = ("exact", "shift", "jpeg", "brightness")
THRESHOLDS = (0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.997, 0.998, 0.999)
COPY_THRESHOLDS = (0.98, 0.99, 0.995, 0.998, 0.999)
SHIFT = 2
JPEG_QUALITY = 75


def fashion_mnist(split: str) -> np.ndarray:
    """Shape: returns (N, 28, 28) uint8."""
    from sslkit.datasets.idx import fashion_mnist as load

    return load(split, None, False, None).images[:, 0].numpy()


def shifted(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    dy, dx = [(SHIFT, 0), (-SHIFT, 0), (0, SHIFT), (0, -SHIFT)][rng.integers(4)]
    out = np.zeros_like(image)
    h, w = image.shape
    out[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = image[
        max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
    ]
    return out


def jpeg(image: np.ndarray) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("L"))


def brightness(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.clip(image.astype(np.float32) * rng.choice([0.7, 1.3]), 0, 255).round().astype(np.uint8)


def with_copies(test: np.ndarray, per_kind: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """The test images followed by ``per_kind`` copies of each kind, of distinct sources, and every item's name."""
    rng = np.random.default_rng(seed)
    sources = rng.permutation(len(test))[: per_kind * len(KINDS)].reshape(len(KINDS), per_kind)
    make = {"exact": lambda x: x.copy(), "shift": lambda x: shifted(x, rng), "jpeg": jpeg,
            "brightness": lambda x: brightness(x, rng)}  # fmt: skip
    images, items = [test], [f"test-{i:05d}.png" for i in range(len(test))]
    for kind, rows in zip(KINDS, sources):
        images.append(np.stack([make[kind](test[row]) for row in rows]))
        items += [f"copy-{kind}-{row:05d}.png" for row in rows]
    return np.concatenate(images), items


def parse(item: str) -> tuple[str, int]:
    """``("test", 1234)`` for an original, ``("<kind>", 1234)`` for a copy of test image 1234."""
    name = Path(item).name
    match = re.fullmatch(r"copy-(\w+)-(\d+)\.png", name)
    if match:
        return match[1], int(match[2])
    return "test", int(re.findall(r"\d+", name)[-1])


def embed_with_run(run: Path, images: np.ndarray) -> np.ndarray:
    """The run's backbone features of grey uint8 images through its evaluation transform.

    Shape:
        images: (N, 28, 28) uint8; returns: (N, D) float32.
    """
    from sslkit.augment import EvalTransform
    from sslkit.datasets import ImageTensorDataset
    from sslkit.datasets.base import DatasetInfo
    from sslkit.datasets.idx import FASHION_MNIST_MEAN, FASHION_MNIST_STD
    from sslkit.evaluation import eval_loader, extract_features
    from sslkit.evaluation.encoder import load_trained_backbone

    cfg, _, backbone = load_trained_backbone(run)
    info = DatasetInfo(1, 28, 10, FASHION_MNIST_MEAN, FASHION_MNIST_STD)
    dataset = ImageTensorDataset(
        torch.from_numpy(images).unsqueeze(1), torch.zeros(len(images), dtype=torch.long), [str(i) for i in range(10)],
        info,
    )  # fmt: skip
    preprocess = EvalTransform(cfg.augment.image_size, 1, info.mean, info.std, cfg.augment.normalize)
    features, _ = extract_features(backbone, eval_loader(dataset, 512), preprocess)
    return features.numpy()


def embed_pixels(images: np.ndarray) -> np.ndarray:
    return images.reshape(len(images), -1).astype(np.float32) / 255


def write_images(folder: Path, per_kind: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    images, items = with_copies(fashion_mnist("test"), per_kind)
    for image, item in zip(images, items):
        Image.fromarray(image).save(folder / item)
    print(f"wrote {len(items)} images to {folder}")


def embeddings(args) -> tuple[np.ndarray, list[str], np.ndarray, str]:
    """(set vectors, set items, train vectors, what made them)."""
    from sslkit.embeddings import read_embeddings, write_embeddings

    if args.embeddings:
        found, train = read_embeddings(args.embeddings), read_embeddings(args.train_embeddings)
        order = np.argsort([int(re.findall(r"\d+", Path(item).stem)[-1]) for item in train.items], kind="stable")
        source = found.meta.get("source", f"folder {args.embeddings}")  # sslkit-embed records its encoder there
        return np.asarray(found.vectors), found.items, np.asarray(train.vectors)[order], source
    images, items = with_copies(fashion_mnist("test"), args.copies_per_kind)
    train_images = fashion_mnist("train")
    embed = embed_pixels if args.pixels else lambda x: embed_with_run(Path(args.run), x)
    source = "raw pixels (flattened, L2-normalised)" if args.pixels else f"run {args.run}"
    vectors, train = embed(images), embed(train_images)
    work = Path(args.work)
    write_embeddings(work / "test-with-copies", vectors, items, meta={"source": source})
    write_embeddings(work / "train", train, [str(i) for i in range(len(train))], meta={"source": source})
    return vectors, items, train, source


def pair_key(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One int64 per unordered pair of rows."""
    low, high = np.minimum(a, b), np.maximum(a, b)
    return low.astype(np.int64) * 1_000_000 + high


def group_pairs(group: np.ndarray) -> np.ndarray:
    """The pair keys of every two rows of a group."""
    first, second = np.triu_indices(len(group), 1)
    return pair_key(group[first], group[second])


def pairs_at_least(unit: torch.Tensor, threshold: float) -> np.ndarray:
    """Every pair (i < j) of rows with cosine similarity >= threshold, exact, a block at a time. Shape: (P, 2)."""
    found = []
    for start in range(0, len(unit), 1024):
        similarity = unit[start : start + 1024] @ unit.T
        rows, columns = torch.nonzero(similarity >= threshold, as_tuple=True)
        keep = columns > rows + start
        found.append(torch.stack([rows[keep] + start, columns[keep]], dim=1))
    return torch.cat(found).numpy()


def evaluate_thresholds(vectors: np.ndarray, items: list[str], thresholds, clusters: int | None) -> list[dict]:
    from sslkit.embeddings import semdedup
    from sslkit.evaluation.search import unit_vectors

    parsed = [parse(item) for item in items]
    row_of_test = {index: row for row, (kind, index) in enumerate(parsed) if kind == "test"}
    injected = {kind: np.array([[row_of_test[i], row] for row, (k, i) in enumerate(parsed) if k == kind])
                for kind in KINDS}  # fmt: skip
    all_injected = np.concatenate(list(injected.values()))
    unit = unit_vectors(vectors)
    rows = []
    for threshold in thresholds:
        started = time.perf_counter()
        found = semdedup(vectors, threshold, num_clusters=clusters)
        seconds = time.perf_counter() - started
        found_pairs = np.concatenate([group_pairs(group) for group in found.groups()] or [np.empty(0, np.int64)])
        exact_pairs = pairs_at_least(unit, threshold)
        split = found.clusters[exact_pairs[:, 0]] != found.clusters[exact_pairs[:, 1]]
        true = np.isin(found_pairs, pair_key(*all_injected.T))
        similarity = (unit[all_injected[:, 0]] * unit[all_injected[:, 1]]).sum(dim=1).numpy()
        row = {
            "threshold": threshold, "seconds": seconds, "found_pairs": len(found_pairs),
            "precision": float(true.mean()) if len(found_pairs) else float("nan"),
            "recall": float(np.isin(pair_key(*all_injected.T), found_pairs).mean()),
            "pairs_at_least_t": float((similarity >= threshold).mean()), "duplicates": found.num_duplicates,
            "exact_pairs": len(exact_pairs), "split_share": float(split.mean()) if len(split) else 0.0,
            "clusters": int(found.clusters.max()) + 1, "kmeans": found.kmeans,
        }  # fmt: skip
        for kind, pairs in injected.items():
            row[f"recall_{kind}"] = float(np.isin(pair_key(*pairs.T), found_pairs).mean())
        rows.append(row)
    return rows


def train_copies(vectors: np.ndarray, items: list[str], train: np.ndarray) -> dict:
    """Each original test image's nearest training image: how many are near-copies at each threshold, and the
    closest pairs."""
    from sslkit.embeddings import near_copies

    originals = np.array([row for row, item in enumerate(items) if parse(item)[0] == "test"])
    copies = near_copies(vectors[originals], train, COPY_THRESHOLDS[0])
    order = np.argsort(-copies.similarity, kind="stable")
    test_index = [parse(items[row])[1] for row in originals]
    closest = [
        {"test": test_index[i], "train": int(copies.nearest[i]), "similarity": float(copies.similarity[i])}
        for i in order[:200]
    ]
    counts = {threshold: int((copies.similarity >= threshold).sum()) for threshold in COPY_THRESHOLDS}
    return {"counts": counts, "of": len(originals), "closest": closest,
            "similarity_quantiles": np.quantile(copies.similarity, [0.5, 0.9, 0.99, 1.0]).tolist()}  # fmt: skip


def picture(closest: list[dict], path: Path, title: str, count: int = 16) -> None:
    """The closest test/train pairs, side by side, with their similarity and their pixels' mean difference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    test, train = fashion_mnist("test"), fashion_mnist("train")
    columns = 8
    rows = -(-count // columns)
    figure, axes = plt.subplots(2 * rows, columns, figsize=(columns * 1.3, rows * 2.9))
    for i, pair in enumerate(closest[:count]):
        top, column = 2 * (i // columns), i % columns
        a, b = test[pair["test"]], train[pair["train"]]
        difference = np.abs(a.astype(int) - b.astype(int)).mean()
        axes[top, column].imshow(a, cmap="gray", vmin=0, vmax=255)
        axes[top, column].set_title(f"test {pair['test']}\n{pair['similarity']:.4f}", fontsize=7)
        axes[top + 1, column].imshow(b, cmap="gray", vmin=0, vmax=255)
        axes[top + 1, column].set_title(f"train {pair['train']}\n|diff| {difference:.1f}", fontsize=7)
    for axis in axes.flat:
        axis.axis("off")
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def render(rows: list[dict], console: Console, title: str) -> None:
    table = Table(title=title)
    columns = ["T", "found pairs", "precision", "recall", *KINDS, "pairs >= T", "split", "s"]
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            f"{row['threshold']}", f"{row['found_pairs']:,}", f"{row['precision']:.3f}", f"{row['recall']:.3f}",
            *(f"{row[f'recall_{kind}']:.3f}" for kind in KINDS), f"{row['pairs_at_least_t']:.3f}",
            f"{row['split_share']:.3f}", f"{row['seconds']:.1f}",
        )  # fmt: skip
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="a run (or checkpoint) directory whose backbone embeds the images here")
    source.add_argument("--embeddings", help="the embeddings folder of the --write-images images (sslkit-embed)")
    source.add_argument("--pixels", action="store_true", help="raw pixels, flattened and L2-normalised")
    source.add_argument("--write-images", metavar="FOLDER", help="only write the test images and the copies as PNGs")
    parser.add_argument("--train-embeddings", help="with --embeddings: the training set's embeddings folder")
    parser.add_argument("--work", default="/tmp/fm-dups", help="where the embeddings folders made here go")
    parser.add_argument("--copies-per-kind", type=int, default=200)
    parser.add_argument("--clusters", type=int, help="SemDeDup's k-means clusters (default: one per 1,000 items)")
    parser.add_argument("--figure", help="the PNG of the closest test/train pairs")
    parser.add_argument("--label", help="what made the embeddings, for the titles (default: the run or folder)")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    if args.write_images:
        write_images(Path(args.write_images), args.copies_per_kind)
        return
    if args.embeddings and not args.train_embeddings:
        parser.error("--embeddings needs --train-embeddings")
    console = Console(width=140)
    vectors, items, train, source = embeddings(args)
    source = args.label or source
    console.print(f"{len(items):,} items ({vectors.shape[1]} dimensions) from {source}")
    rows = evaluate_thresholds(vectors, items, THRESHOLDS, args.clusters)
    render(rows, console, f"injected pairs found by SemDeDup ({source}; {rows[0]['clusters']} clusters)")
    copies = train_copies(vectors, items, train)
    counts = ", ".join(f">= {threshold}: {count:,}" for threshold, count in copies["counts"].items())
    console.print(f"test images (of {copies['of']:,}) with a training image at similarity {counts}")
    quantiles = " / ".join(f"{q:.4f}" for q in copies["similarity_quantiles"])
    console.print(f"similarity to the nearest training image, quantiles 50/90/99/100%: {quantiles}")
    if args.figure:
        title = f"Fashion-MNIST: the test images closest to a training image ({source})"
        picture(copies["closest"], Path(args.figure), title)
        console.print(f"wrote {args.figure}")
    if args.out:
        Path(args.out).write_text(json.dumps({"source": source, "thresholds": rows, "train_copies": copies}, indent=2))
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
