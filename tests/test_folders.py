"""Image folders as they come: listing at any depth, every image mode to RGB uint8, corrupt files
counted and replaced, padded batches of different sizes, and the evaluation's centre crop.

Every image here is a real file written with Pillow and read back through the real decoders.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as TF

from sslkit.augment import EvalTransform, crop_padded, resized_crop
from sslkit.config import Config
from sslkit.datasets import build_dataset, decode, folders
from sslkit.datasets.batches import EncodedBatch, ImageBatch, pad_images
from sslkit.errors import UserError


def _rgb(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)


def _bytes(image: Image.Image, fmt: str) -> torch.Tensor:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


@pytest.mark.parametrize(
    "mode, fmt",
    [("RGB", "PNG"), ("L", "PNG"), ("LA", "PNG"), ("RGBA", "PNG"), ("P", "PNG"), ("CMYK", "JPEG"), ("RGB", "BMP")],
)
def test_every_mode_decodes_to_rgb_uint8_as_pillow_converts_it(mode, fmt):
    image = Image.fromarray(_rgb(7, 11)).convert(mode)
    decoded = decode.decode_rgb(_bytes(image, fmt))
    assert decoded.dtype == torch.uint8 and decoded.shape == (3, 7, 11)
    expected = torch.from_numpy(np.array(Image.open(io.BytesIO(_bytes(image, fmt).numpy().tobytes())).convert("RGB")))
    # Lossless formats agree exactly; CMYK JPEG differs by the decoders' rounding of the colour transform.
    tolerance = 3 if fmt == "JPEG" else 0
    assert (decoded.permute(1, 2, 0).int() - expected.int()).abs().max() <= tolerance


def test_a_16_bit_png_is_scaled_to_8_bits():
    grey16 = (np.arange(12, dtype=np.uint16).reshape(3, 4) * 5000).astype(np.uint16)
    decoded = decode.decode_rgb(_bytes(Image.fromarray(grey16), "PNG"))
    assert decoded.dtype == torch.uint8 and decoded.shape == (3, 3, 4)
    expected = torch.from_numpy(grey16.astype(np.int64)) / 257  # 65535 -> 255
    assert (decoded[0] - expected).abs().max() <= 1 and torch.equal(decoded[0], decoded[2])


def test_corrupt_and_truncated_bytes_decode_to_none_and_max_size_keeps_aspect():
    jpeg = _bytes(Image.fromarray(_rgb(40, 100)), "JPEG")
    assert decode.decode_rgb(jpeg[:60]) is None  # truncated inside the header
    assert decode.decode_rgb(torch.tensor(list(b"not an image"), dtype=torch.uint8)) is None
    assert decode.decode_rgb(jpeg, max_size=50).shape == (3, 20, 50)
    assert decode.decode_rgb(jpeg, max_size=500).shape == (3, 40, 100)


def test_decode_on_the_cpu_device_falls_back_per_file():
    good, bad = _bytes(Image.fromarray(_rgb(5, 6)), "JPEG"), torch.zeros(10, dtype=torch.uint8)
    images = decode.decode_on_device([good, bad], torch.device("cpu"))
    assert images[0].shape == (3, 5, 6) and images[1] is None
    batch = EncodedBatch([good, bad, good], ["a.jpg", "b.jpg", "c.jpg"]).to("cpu").decode()
    assert batch.corrupt == ("b.jpg",) and batch.sizes.tolist() == [[5, 6]] * 3


def write_folder(root, count: int = 12):
    """Images of every mode and size at three depths, plus files that are not images."""
    modes = ["RGB", "L", "RGBA", "P", "CMYK", "I;16"]
    for i in range(count):
        folder = root / ("deep/er" if i % 3 == 0 else "flat" if i % 3 == 1 else "")
        folder.mkdir(parents=True, exist_ok=True)
        image = Image.fromarray(_rgb(8 + i, 20 - i, seed=i))
        mode = modes[i % len(modes)]
        if mode == "I;16":
            image = Image.fromarray(np.asarray(image.convert("L")).astype(np.uint16) * 257)
        else:
            image = image.convert(mode)
        image.save(folder / f"{i:03d}.{'jpg' if mode in ('RGB', 'CMYK') else 'png'}")
    (root / "notes.txt").write_text("not an image")
    (root / ".hidden.png").write_bytes(b"")
    (root / "flat" / "labels.csv").write_text("a,b")


def test_a_folder_lists_every_image_at_any_depth_unlabelled(tmp_path):
    write_folder(tmp_path)
    dataset = build_dataset("imagefolder", root=str(tmp_path))
    assert len(dataset) == 12 and dataset.labels.tolist() == [-1] * 12 and dataset.info.channels == 3
    images, labels = dataset.__getitems__(list(range(12)))
    assert isinstance(images, ImageBatch) and images.pixels.dtype == torch.uint8 and images.corrupt == ()
    assert sorted(images.sizes.tolist()) == sorted([8 + i, 20 - i] for i in range(12))
    with pytest.raises(UserError, match="no 'test' split.*eval.data.root"):
        build_dataset("imagefolder", "test", root=str(tmp_path))


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda root: root / "missing", "does not exist"),
        (lambda root: root, "no images"),
        (lambda root: (root / "a.txt").write_text("x") and root, "1 other files were ignored"),
    ],
)
def test_bad_roots_are_one_line(tmp_path, make, words):
    root = make(tmp_path)
    with pytest.raises(UserError, match=words) as error:
        build_dataset("imagefolder", root=str(root))
    assert "\n" not in str(error.value)


def test_a_corrupt_file_is_replaced_by_the_next_good_one_and_named(tmp_path):
    write_folder(tmp_path, count=6)
    dataset = build_dataset("imagefolder", root=str(tmp_path))
    bad = dataset.paths[2]
    bad.write_bytes(bad.read_bytes()[:40])  # truncated
    images, _ = dataset.__getitems__([2, 3])
    assert images.corrupt == (str(bad),)
    assert torch.equal(images.pixels[0], images.pixels[1])  # image 2 replaced by image 3


class _OneProcess:
    num_processes, is_main_process, device = 1, True, torch.device("cpu")

    @staticmethod
    def reduce(tensor, reduction):
        return tensor


def test_corrupt_count_skips_under_one_percent_and_stops_above_it_in_one_line():
    count = folders.CorruptCount("skip", 300, _OneProcess())
    count.add(["a.jpg"])
    count.add(["a.jpg", "b.jpg", "c.jpg"])  # 3 of 300: 1%, not more
    assert count.end_epoch(0) == 3 and count.names == {}
    count.add(["a.jpg", "b.jpg", "c.jpg"])
    with pytest.raises(UserError, match=r"more than 1% of the 300 images are corrupt \(4 found.*a.jpg, b.jpg, c.jpg"):
        count.add(["d.jpg"])
    with pytest.raises(UserError, match="cannot decode image x.png.*data.on_corrupt=skip"):
        folders.CorruptCount("error", 300, _OneProcess()).add(["x.png"])


def test_padding_repeats_the_edge_so_a_crop_reads_what_the_image_alone_gives():
    small, large = (torch.from_numpy(_rgb(h, w, seed=h)).permute(2, 0, 1).contiguous() for h, w in ((9, 13), (20, 17)))
    pixels, sizes = pad_images([small, large])
    assert pixels.shape == (2, 3, 20, 17) and sizes.tolist() == [[9, 13], [20, 17]]
    boxes = torch.tensor([[0.0, 0.0, 12.0, 8.0], [5.0, 2.0, 12.0, 8.0]])  # the whole image, and a corner crop
    for size in (6, 32):  # roi_align (shrinking) and grid_sample (enlarging)
        padded = crop_padded(ImageBatch(pixels, sizes), boxes, torch.tensor([0, 0]), size)
        alone = resized_crop(small[None].float() / 255, boxes, torch.tensor([0, 0]), size)
        torch.testing.assert_close(padded, alone, atol=1e-6, rtol=0)


def test_evaluation_resizes_the_shorter_side_and_crops_the_centre():
    # A smooth image: the two antialiasing filters (roi_align's box average, torchvision's triangle) differ on noise.
    y, x = torch.meshgrid(torch.arange(30.0), torch.arange(60.0), indexing="ij")
    image = torch.stack([x * 4, y * 8, 128 + 100 * torch.sin(x / 6)]).round().to(torch.uint8)  # (3, 30, 60)
    pixels, sizes = pad_images([image, image[:, :, 15:45].contiguous()])
    ours = EvalTransform(15, 3, (0.0,) * 3, (1.0,) * 3, normalize=False)(ImageBatch(pixels, sizes))
    assert ours.shape == (2, 3, 15, 15)
    # The central 30 x 30 square resized to 15: the two antialiasing resamplers agree to rounding.
    square = TF.resize(image[:, :, 15:45], [15, 15], antialias=True).float() / 255
    assert (ours[0] - square).abs().max() < 0.02  # 3/255 at most: uint8 rounding, the edge band
    # torchvision's Resize(15) + CenterCrop(15) rounds the crop's offset to whole output pixels (7.5 -> 8).
    reference = TF.center_crop(TF.resize(image, 15, antialias=True), [15, 15]).float() / 255
    assert (ours[0] - reference).abs().mean() < 0.03
    torch.testing.assert_close(ours[1], ours[0], atol=0.03, rtol=0)  # the square is the same centre, resized


def test_eval_data_gives_the_kNN_memory_and_test_split_of_an_unlabelled_run(tmp_path):
    from sslkit.datasets import build_splits

    write_folder(tmp_path / "unlabelled")
    for split, count in (("train", 3), ("test", 2)):
        for name in ("cat", "dog"):
            (tmp_path / "eval" / split / name).mkdir(parents=True)
            for i in range(count):
                Image.fromarray(_rgb(10, 12, seed=i)).save(tmp_path / "eval" / split / name / f"{i}.png")
    cfg = Config()
    cfg.data.name, cfg.data.root = "imagefolder", str(tmp_path / "unlabelled")
    alone = build_splits(cfg)
    assert len(alone.train) == 12 and alone.memory is None and alone.test is None
    cfg.eval.data.root = str(tmp_path / "eval")
    splits = build_splits(cfg)
    assert len(splits.train) == 12 and (len(splits.memory), len(splits.test)) == (6, 4)
    assert splits.memory.labels.tolist() == [0, 0, 0, 1, 1, 1] and splits.info.num_classes == 2


def test_bytes_for_the_device_decode_to_the_same_batch(tmp_path):
    """The accelerator path (workers read bytes, the device decodes); on the CPU every file takes the fallback."""
    write_folder(tmp_path, count=6)
    dataset = build_dataset("imagefolder", root=str(tmp_path))
    decoded, _ = dataset.__getitems__(list(range(6)))
    dataset.decode_on_device = True
    encoded, _ = dataset.__getitems__(list(range(6)))
    assert isinstance(encoded, EncodedBatch)
    again = encoded.to("cpu").decode()
    assert torch.equal(again.pixels, decoded.pixels) and torch.equal(again.sizes, decoded.sizes)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="nvJPEG needs a CUDA device")
def test_jpegs_decode_on_a_cuda_device_as_on_the_cpu():
    jpegs = [_bytes(Image.fromarray(_rgb(30 + i, 50 - i, seed=i)), "JPEG") for i in range(4)]
    png = _bytes(Image.fromarray(_rgb(9, 9)), "PNG")  # not a JPEG: decoded on the CPU and moved
    images = decode.decode_on_device([*jpegs, png, torch.zeros(5, dtype=torch.uint8)], torch.device("cuda"))
    assert images[-1] is None and all(image.device.type == "cuda" for image in images[:-1])
    for data, image in zip([*jpegs, png], images):
        assert (image.cpu().int() - decode.decode_rgb(data).int()).abs().max() <= 3  # IDCT rounding


def test_an_evaluation_set_of_another_channel_count_is_one_line(tmp_path):
    from sslkit.datasets import build_splits

    write_folder(tmp_path)
    cfg = Config()
    cfg.data.name, cfg.data.root, cfg.eval.data.name = "imagefolder", str(tmp_path), "digits"
    with pytest.raises(UserError, match="eval.data digits has 1-channel images but the training data 3-channel"):
        build_splits(cfg)
