"""Write the images of a folder into tar shards that ``data.name=webdataset`` streams.

Every image under the folder, at any depth (as ``data.name=imagefolder`` lists them), goes
into a shard as its original bytes, under a key made of its position in that sorted list
(``000123.jpg``); the member ``000123.path`` records its path relative to the folder. Shards
hold ``--per-shard`` images each (the last one the rest) and are written by webdataset's
``ShardWriter``:

    sslkit-write-shards ~/photos shards/photos-%06d.tar --per-shard 1000
    sslkit-pretrain recipes/simclr.yaml data.name=webdataset \\
        data.root='shards/photos-{000000..000009}.tar'

Every sample is read once an epoch when the shards hold equal numbers of images, their number is
a multiple of processes x ``data.num_workers`` (the readers), and each reader's share is a
multiple of the per-process batch size: every reader must yield the same number of full batches,
so the images past a reader's last full batch are skipped that epoch. The command prints the
brace pattern of what it wrote, and warns when its last shard is smaller than the others.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sslkit.cli.early_checks import at_least
from sslkit.console import print_user_error
from sslkit.errors import UserError


def check_request(folder: Path, pattern: str, per_shard: int) -> None:
    """One line for a count, a pattern or a folder that cannot make shards; it imports nothing heavy, so that
    ``main`` runs it before the datasets (torch) are imported."""
    at_least(per_shard, 1, "--per-shard")
    if "%" not in pattern:
        raise UserError(f"the shard pattern {pattern} needs a number placeholder, e.g. shards/train-%06d.tar")
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder of images")


def write_shards(folder: Path, pattern: str, per_shard: int) -> list[str]:
    """Write the images under ``folder`` into shards named by ``pattern`` (``%06d`` numbers them); returns them."""
    from sslkit.datasets import folders, shards

    wds = shards._webdataset()
    check_request(folder, pattern, per_shard)
    paths = folders.list_images(folder)
    if not paths:
        raise UserError(f"no images ({', '.join(folders.IMAGE_EXTENSIONS)}) under {folder}")
    Path(pattern).parent.mkdir(parents=True, exist_ok=True)
    written = []
    with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0, post=written.append) as sink:
        for index, path in enumerate(paths):
            extension = path.suffix.lower().lstrip(".")
            sink.write(
                {"__key__": f"{index:06d}", extension: path.read_bytes(), "path": str(path.relative_to(folder))}
            )
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sslkit-write-shards", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the image folder (any layout, any depth)")
    parser.add_argument("pattern", help="where the shards go, with a number placeholder: shards/train-%%06d.tar")
    parser.add_argument("--per-shard", type=int, default=1000, help="images per shard (default 1000)")
    args = parser.parse_args(argv)
    try:
        check_request(args.folder.expanduser(), args.pattern, args.per_shard)
        written = write_shards(args.folder.expanduser(), args.pattern, args.per_shard)
    except UserError as error:
        print_user_error(error)
        return 2
    last = len(written) - 1
    print(f"wrote {len(written)} shards: data.root='{args.pattern.replace('%06d', f'{{000000..{last:06d}}}')}'")
    if (note := uneven_note(count_images(args.folder.expanduser()), args.per_shard)) is not None:
        print(f"warning: {note}")
    return 0


def count_images(folder: Path) -> int:
    from sslkit.datasets import folders

    return len(folders.list_images(folder))


def uneven_note(images: int, per_shard: int) -> str | None:
    """What a smaller last shard costs at training time, and ``--per-shard`` values that divide ``images`` evenly."""
    rest = images % per_shard
    if images <= per_shard or rest == 0:
        return None
    even = [d for d in range(max(1, per_shard // 2), min(images, 2 * per_shard) + 1) if images % d == 0]
    nearest = sorted(even, key=lambda d: abs(d - per_shard))[:2]
    advice = (
        f"--per-shard {' or '.join(map(str, sorted(nearest)))} makes shards of equal size"
        if nearest
        else "a --per-shard that divides the number of images makes shards of equal size"
    )
    return (
        f"the last shard holds {rest} of {per_shard} images; training reads only what gives every reader (process x "
        f"data.num_workers) the same number of full batches, so shards of unequal size skip images each epoch; "
        f"{advice} (see sslkit-write-shards --help)"
    )


if __name__ == "__main__":
    sys.exit(main())
