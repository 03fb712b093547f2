"""Embed images with a trained encoder: an embeddings folder (embeddings.npy, items.csv, meta.json).

    sslkit-embed runs/quickstart                                  # the run's own training images
    sslkit-embed runs/fashion --data fashion_mnist --split test --dtype float16
    sslkit-embed runs/x --data ~/photos --out /data/photos-embeddings
    sslkit-embed runs/x/export-timm --data ~/photos              # a timm folder from sslkit-export
    accelerate launch --num_processes 2 -m sslkit.cli.embed runs/x --data ~/photos

SOURCE is a run directory, a checkpoint directory in one, a backbone file (with ``--recipe``, as for
sslkit-evaluate) or a timm folder written by ``sslkit-export --format timm``. The images go through the
run's evaluation transform. Running the same command again continues an interrupted one from its
last finished chunk. The folder format is described in docs/embeddings.md.
"""

from __future__ import annotations

import argparse
import sys

# The parser lives beside the argv builder that the experiments start this command with.
from sslkit.command_lines.embed import OPTIONS, parse_args


def split_root(overrides: list[str], data: str | None) -> tuple[list[str], str | None]:
    """With ``--data``, a ``data.root=DIR`` override says where that dataset is, not where the run's is."""
    if data is None:
        return overrides, None
    roots = [o.split("=", 1)[1] for o in overrides if o.startswith("data.root=")]
    return [o for o in overrides if not o.startswith("data.root=")], (roots[-1] if roots else None)


def check_early(args: argparse.Namespace) -> None:
    """The batch size and the source, before torch is imported."""
    from sslkit.cli.early_checks import at_least, existing_path

    if args.batch_size is not None:
        at_least(args.batch_size, 1, "--batch-size")
    existing_path(args.source, "a run directory, a checkpoint, a backbone file or a timm folder")


def main(argv: list[str] | None = None) -> int:
    from sslkit.cli.early_checks import refused
    from sslkit.cli.options import reject_unknown_option
    from sslkit.console import print_user_error
    from sslkit.errors import UserError

    if reject_unknown_option(sys.argv[1:] if argv is None else argv, OPTIONS):
        return 2
    args = parse_args(argv)
    if refused(check_early, args):
        return 2
    from sslkit.loop.launch import cpu_threads, relaunch_cpu_processes

    if argv is None and (code := relaunch_cpu_processes()) is not None:
        return code
    from sslkit.console import console
    from sslkit.embeddings import embed_to_folder, read_embeddings
    from sslkit.embeddings.extract import process_state

    state = process_state()
    if state.device.type == "cpu":
        cpu_threads(None)  # accelerate launch may have pinned one thread (sslkit/loop/launch.py)
    overrides, root = split_root(args.overrides, args.data)
    try:
        out, done = embed_to_folder(
            args.source, args.out, args.data, args.split, root, args.layer, args.dtype, args.normalize,
            args.batch_size, args.recipe, overrides, args.overwrite,
        )  # fmt: skip
    except UserError as error:
        print_user_error(error)
        return 2
    except KeyboardInterrupt:  # the chunks written so far are recorded: nothing is lost but the one under way
        print_user_error(UserError("stopped; run the same command again to continue from the last chunk written"))
        return 130
    if state.is_main_process:
        meta = read_embeddings(out).meta
        what = f"{meta['count']} x {meta['dimension']} {meta['dtype']} embeddings of {meta['data']['name']} "
        what += meta["data"]["split"]
        if done["already_complete"]:
            console.print(f"{out} already holds the {what}; --overwrite computes them again", soft_wrap=True)
        else:
            resumed = f"; {done['resumed_from']} rows were there already" if done["resumed_from"] else ""
            rate = done["rows"] / max(done["seconds"], 1e-9)
            console.print(f"{what} written to {out} ({rate:,.0f} images/s{resumed})", soft_wrap=True)
        if (given := meta["transform"].get("converted_from_channels")) is not None:
            takes, how = meta["transform"]["channels"], "as grey (ITU-R BT.601 luma)" if given == 3 else "as RGB"
            note = f"note: the encoder takes {takes}-channel images: the {given}-channel ones were read {how}"
            console.print(note, soft_wrap=True)
    state.wait_for_everyone()
    state.destroy_process_group()  # leave together: a process that exits while another tears down gloo can abort
    return 0


if __name__ == "__main__":
    sys.exit(main())
