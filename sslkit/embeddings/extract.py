"""Embeddings of a dataset by an encoder: in memory (:func:`embed`) or as a folder on disk (:func:`embed_to_folder`).

    vectors = embed("runs/quickstart", data="digits", split="test")     # (360, 128) float32
    embed_to_folder("runs/photos", data="~/photos")                      # runs/photos/embeddings-photos-train/

The encoder and its input are those of :mod:`sslkit.embeddings.encoders`, the images those of
:mod:`sslkit.embeddings.images`; each image goes through the run's evaluation transform, the network
in eval mode, and (``normalize``) an L2 normalisation, so that cosine similarity is a dot product.

Across processes (``accelerate launch -m sslkit.cli.embed``), the folder's chunks
(:mod:`sslkit.embeddings.writer`) are dealt round-robin: in round ``r`` process ``p`` encodes the
``(r * P + p)``-th chunk still to do and writes its rows into the shared ``embeddings.npy`` itself
(the output folder must be on a file system every process sees); the chunks finished in the round
are then gathered (their numbers only, never their rows) and the main process records them. Rows
keep the dataset's order whatever the number of processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text
from torch.utils.data import DataLoader

from sslkit.augment.channels import CONVERTIBLE
from sslkit.datasets import collate_batch
from sslkit.datasets.batches import ImageBatch
from sslkit.distributed import cpu_processes_launched
from sslkit.embeddings.encoders import Encoder, load_encoder, recipe_of, source_kind
from sslkit.embeddings.images import Images, images_to_embed
from sslkit.embeddings.store import DTYPES
from sslkit.embeddings.writer import EmbeddingsWriter
from sslkit.errors import UserError

# A chunk is this many batches: the work lost to an interruption, and the rows between two meta.json updates.
CHUNK_BATCHES = 16


def prepare(
    source: str | Path,
    data: str | None = None,
    split: str | None = None,
    root: str | None = None,
    layer: str = "backbone",
    recipe: str | Path | None = None,
    overrides: list[str] | None = None,
):
    """The recipe, the images and the encoder, checked against one another; see :func:`embed` for the arguments."""
    source = Path(source)
    cfg = recipe_of(source, recipe, overrides)
    if data is None and source_kind(source) == "timm folder":
        raise UserError(f"'{source}' is a timm folder, which names no dataset; give --data (a dataset or a folder)")
    images = images_to_embed(cfg, data, split, root)
    encoder = load_encoder(source, cfg, layer, images.info if images.is_run_data else None)
    takes, given = encoder.transform.channels, images.info.channels
    if (given, takes) in CONVERTIBLE:  # grey <-> RGB, as an encoder of the other kind needs them
        encoder = dataclasses.replace(encoder, transform=dataclasses.replace(encoder.transform, converted_from=given))
    elif takes != given:
        raise UserError(
            f"the encoder takes {takes}-channel images but {images.name} has {given}-channel ones; "
            f"embed them with an encoder trained on {given}-channel images"
        )
    return cfg, images, encoder


@torch.no_grad()
def encode_chunks(
    encoder: Encoder,
    images: Images,
    chunks: list[range],
    batch_size: int,
    normalize: bool,
    device: torch.device,
    num_workers: int = 0,
    on_batch=None,
    memory_format: torch.memory_format = torch.channels_last,
):
    """The features of each range of rows in ``chunks``, one (rows, D) float32 CPU tensor per chunk, in order.

    Batches never straddle two chunks; ``on_batch(rows)`` is called after each. The network runs in
    ``memory_format``: channels_last gives 1.5x the images/s of the default layout on a CPU (oneDNN), with
    features equal to 1e-6 (tools/bench/memory_format.py), and is the layout GPU convolutions prefer.
    """
    if not chunks:
        return
    batches = [list(range(s, min(s + batch_size, c.stop))) for c in chunks for s in range(c.start, c.stop, batch_size)]
    loader = DataLoader(images.dataset, batch_sampler=batches, num_workers=num_workers, collate_fn=collate_batch)
    network = encoder.network.to(device).eval().to(memory_format=memory_format)
    transform = encoder.transform.module().to(device)
    batches_of = iter(loader)
    for chunk in chunks:
        parts, done = [], 0
        while done < len(chunk):
            pixels, _ = next(batches_of)
            if isinstance(pixels, ImageBatch) and pixels.corrupt:
                raise UserError(
                    f"cannot decode image {pixels.corrupt[0]}; remove or fix it, then run the same command again"
                )
            features = network(transform(pixels.to(device))).float()  # (B, D)
            parts.append((F.normalize(features, dim=1) if normalize else features).cpu())
            done += len(features)
            if on_batch is not None:
                on_batch(len(features))
        yield torch.cat(parts)


def embed(
    source: str | Path,
    data: str | None = None,
    split: str | None = None,
    root: str | None = None,
    layer: str = "backbone",
    normalize: bool = True,
    batch_size: int | None = None,
    recipe: str | Path | None = None,
    overrides: list[str] | None = None,
    device: str | torch.device | None = None,
) -> torch.Tensor:
    """Embeddings of every image of a dataset split, in memory, in this process.

    Args:
        source: a run directory, a checkpoint, a backbone file (with ``recipe``) or a timm folder.
        data: a dataset name, a folder of images or tar shards (default: the run's own dataset).
        split: the split (default: the run's ``data.train_split``, or ``train``).
        root: where ``data``'s files are, for a dataset name (default: the recipe's, or the standard place).
        layer: ``backbone`` (pooled features) or ``projector`` (the method's projection head).
        normalize: L2-normalise each row.
        batch_size: images per batch (default: the recipe's ``eval.batch_size``).
        recipe: the recipe of a backbone file.
        overrides: ``key=value`` changes to the recipe (``data.num_workers=4``, ...).
        device: where the network runs (default: CUDA when available, else the CPU).

    Shape:
        returns: (N, D) float32 on the CPU, row i the i-th image of the split (``items.csv``'s order).
    """
    cfg, images, encoder = prepare(source, data, split, root, layer, recipe, overrides)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    batch_size = batch_size or cfg.eval.batch_size
    chunk_rows = batch_size * CHUNK_BATCHES
    chunks = [range(s, min(s + chunk_rows, len(images))) for s in range(0, len(images), chunk_rows)]
    parts = encode_chunks(encoder, images, chunks, batch_size, normalize, device, cfg.data.num_workers)
    return torch.cat(list(parts))


def default_out(source: Path, encoder: Encoder, images: Images) -> Path:
    """``embeddings-<data>-<split>`` (``-projector``) in the run directory (with the step for a checkpoint, whose
    directory the run may rotate away), or beside a backbone file or timm folder."""
    name = f"embeddings-{images.name}-{images.split}" + ("-projector" if encoder.layer == "projector" else "")
    if encoder.kind == "run":
        return source / name
    if encoder.kind == "checkpoint":
        return encoder.run_dir / f"{name}-{source.name}"
    return source.parent / name


def description(source: Path, encoder: Encoder, images: Images, normalize: bool) -> dict:
    """What ``meta.json`` says was embedded, and how: the same command continues a folder that says the same."""
    t = encoder.transform
    # In this order, the settings a user chose come first in the one line naming a difference.
    return {
        "layer": encoder.layer,
        "data": images.describe(),
        "normalized": normalize,
        "items_sha256": hashlib.sha256("\n".join(images.items).encode()).hexdigest(),  # the same images, in order
        "source": str(source.resolve()),
        "source_kind": encoder.kind,
        "backbone": encoder.description,
        "transform": {
            "image_size": t.image_size,
            "channels": t.channels,
            "mean": t.mean,
            "std": t.std,
            "normalize": t.normalize,
            # Only where the images were converted: a folder written without a conversion still says the same.
            **({"converted_from_channels": t.converted_from} if t.converted_from is not None else {}),
        },
        "weights_sha256": encoder.weights_sha256(),
    }


def embed_to_folder(
    source: str | Path,
    out: str | Path | None = None,
    data: str | None = None,
    split: str | None = None,
    root: str | None = None,
    layer: str = "backbone",
    dtype: str = "float32",
    normalize: bool = True,
    batch_size: int | None = None,
    recipe: str | Path | None = None,
    overrides: list[str] | None = None,
    overwrite: bool = False,
    show_progress: bool = True,
) -> tuple[Path, dict]:
    """Write the embeddings of a dataset split as an embeddings folder (:mod:`sslkit.embeddings.store`), in chunks,
    in this process and any others launched with it; a folder left unfinished by the same call is continued.

    Arguments as :func:`embed`, and:
        out: the folder (default: :func:`default_out`).
        dtype: ``float32`` or ``float16`` (half the size, about 3 significant digits).
        overwrite: replace a folder holding other embeddings.
        show_progress: a progress bar on the main process.

    Returns:
        The folder, and what this call did: ``rows`` encoded, ``seconds`` it took, ``write_seconds`` of them
        this process spent writing rows to the file, ``resumed_from`` (rows found done), ``already_complete``.
    """
    from accelerate.utils import broadcast_object_list, gather_object

    if dtype not in DTYPES:
        raise UserError(f"unknown dtype '{dtype}'; choose one of: {', '.join(DTYPES)}")
    state = process_state()
    source = Path(source)
    cfg, images, encoder = prepare(source, data, split, root, layer, recipe, overrides)
    out = Path(out) if out is not None else default_out(source, encoder, images)
    batch_size = batch_size or cfg.eval.batch_size
    shape = (len(images), encoder.dimension())
    meta = description(source, encoder, images, normalize)
    failure = [None]
    if state.is_main_process:
        try:
            EmbeddingsWriter.start(
                out, meta, shape, dtype, batch_size * CHUNK_BATCHES, images.items, images.labels, overwrite
            )
        except UserError as error:
            failure = [str(error)]
    if state.num_processes > 1:  # every process stops with the main one's line, rather than wait for it
        failure = broadcast_object_list(failure)
    if failure[0] is not None:
        raise UserError(failure[0])
    writer = EmbeddingsWriter.join(out)
    report = {"rows": 0, "seconds": 0.0, "write_seconds": 0.0, "resumed_from": writer.rows_done()}
    report["already_complete"] = writer.complete
    if writer.complete:
        return out, report

    remaining = [chunk for chunk in range(writer.chunks) if chunk not in writer.done]
    mine = remaining[state.process_index :: state.num_processes]
    rows_left = sum(len(writer.rows(chunk)) for chunk in remaining)
    started = time.perf_counter()
    with _progress(state.is_main_process and show_progress) as progress:
        task = progress.add_task("embed", total=rows_left)
        # The main process's batches stand for every process's until a round's exact count comes in.
        on_batch = lambda rows: progress.advance(task, rows * state.num_processes)  # noqa: E731
        features = encode_chunks(
            encoder, images, [writer.rows(c) for c in mine], batch_size, normalize, state.device,
            cfg.data.num_workers, on_batch,
        )  # fmt: skip
        for round_ in range(math.ceil(len(remaining) / state.num_processes)):
            finished = []
            if round_ < len(mine):
                vectors = next(features).numpy().astype(dtype)
                written = time.perf_counter()
                writer.write(mine[round_], vectors)
                report["write_seconds"] += time.perf_counter() - written
                finished = [mine[round_]]
            if state.num_processes > 1:
                finished = gather_object(finished)
            if state.is_main_process:
                writer.record(finished)
            progress.update(task, completed=writer.rows_done() - report["resumed_from"])
    if state.is_main_process:
        writer.finish()
    state.wait_for_everyone()
    report.update(rows=rows_left, seconds=time.perf_counter() - started)
    return out, report


def process_state():
    """This process's place among those launched together (accelerate's ``PartialState``).

    On the CPU, asked for by ``accelerate launch --cpu`` or because there is no GPU
    (:func:`sslkit.distributed.cpu_processes_launched`).
    """
    from accelerate import PartialState

    return PartialState(cpu=cpu_processes_launched() or not torch.cuda.is_available())


class _ImagesPerSecond(ProgressColumn):
    """The bar's throughput in images a second."""

    def render(self, task) -> Text:
        return Text(f"{task.speed:,.0f} images/s" if task.speed else "", style="progress.data.speed")


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("embedding"),
        BarColumn(),
        MofNCompleteColumn(),
        _ImagesPerSecond(),
        TimeRemainingColumn(),
        transient=True,
        disable=not enabled,
    )
