"""Image bytes -> RGB uint8 tensors, on the CPU or in batches on a CUDA device.

Every image, whatever its mode, comes out as RGB uint8 ``(3, H, W)``: grey, grey + alpha,
RGBA and palette images through ``torchvision.io.decode_image(..., mode=RGB)``, 16-bit PNGs
scaled from uint16 to uint8, and whatever torchvision cannot decode (CMYK JPEGs, BMP, TIFF)
through Pillow, which converts any of its modes to RGB. An animated image gives its first frame.

A file that neither can decode is *corrupt*: :func:`decode_rgb` returns None rather than
raising, so the loader decides what a corrupt file costs (``data.on_corrupt``,
:mod:`sslkit.datasets.folders`).

``max_size`` reduces an image whose longer side exceeds it, keeping its aspect ratio (antialiased,
as torchvision's ``Resize(max_size=...)``): loading cost, not augmentation, since the random crops
are drawn afterwards on what was decoded.

On a CUDA device :func:`decode_on_device` decodes the JPEGs of a batch in one
``torchvision.io.decode_jpeg(..., device="cuda")`` call (nvJPEG); other formats, and JPEGs that
nvJPEG refuses, fall back to :func:`decode_rgb` one file at a time.

>>> import io; from PIL import Image
>>> buffer = io.BytesIO(); Image.new("L", (5, 3)).save(buffer, "PNG")
>>> decode_rgb(torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)).shape
torch.Size([3, 3, 5])
"""

from __future__ import annotations

import contextlib
import io
import warnings

import torch
from torchvision.io import ImageReadMode, decode_image, decode_jpeg
from torchvision.transforms.v2 import functional as TF

# JPEG files start with the SOI marker FF D8 FF.
_JPEG_MAGIC = b"\xff\xd8\xff"


@contextlib.contextmanager
def _quiet():
    """torchvision 0.29 deprecates its decoders in favour of TorchCodec, which is not a dependency
    here; without this its warning would repeat once per image."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="The image decoding and encoding capabilities", category=DeprecationWarning
        )
        yield


def is_jpeg(data: torch.Tensor) -> bool:
    """Whether the encoded bytes ``data`` (1-D uint8) are a JPEG, by its start-of-image marker."""
    return data.numel() >= 3 and bytes(data[:3].tolist()) == _JPEG_MAGIC


def reduce_to(image: torch.Tensor, max_size: int | None) -> torch.Tensor:
    """``image`` shrunk so that its longer side is ``max_size`` (aspect kept); unchanged if it fits.

    Shape:
        image: (3, H, W) uint8; returns (3, h, w) with ``max(h, w) <= max_size``.
    """
    height, width = image.shape[-2:]
    if max_size is None or max(height, width) <= max_size:
        return image
    factor = max_size / max(height, width)
    size = [max(1, round(height * factor)), max(1, round(width * factor))]
    return TF.resize(image, size, antialias=True)


def _to_rgb_uint8(image: torch.Tensor) -> torch.Tensor:
    if image.dim() == 4:  # an animated GIF or WebP: (frames, C, H, W); use the first frame
        image = image[0]
    if image.dtype != torch.uint8:  # 16-bit PNGs decode to uint16
        image = TF.to_dtype(image, torch.uint8, scale=True)
    return image


def _decode_with_pillow(data: torch.Tensor) -> torch.Tensor | None:
    """Pillow's decoder for what torchvision's refuses (CMYK JPEG, BMP, TIFF); None if it cannot either."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data.numpy().tobytes())) as image:
            image.seek(0)
            rgb = image.convert("RGB")  # CMYK, palette, 16-bit grey, alpha: every mode Pillow has
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError, EOFError):  # truncated or unknown
        return None
    return TF.pil_to_tensor(rgb)


def decode_rgb(data: torch.Tensor, max_size: int | None = None) -> torch.Tensor | None:
    """Decode an encoded image to RGB uint8, reduced to ``max_size``; None if the bytes are corrupt.

    Args:
        data: the file's bytes.
        max_size: the longest side kept (:func:`reduce_to`); None keeps the decoded size.

    Shape:
        data: (L,) uint8; returns (3, H, W) uint8.
    """
    try:
        with _quiet():
            image = _to_rgb_uint8(decode_image(data, mode=ImageReadMode.RGB))
    except RuntimeError:  # a format or mode torchvision does not read, or broken bytes
        image = _decode_with_pillow(data)
    if image is None or image.shape[0] != 3 or min(image.shape[-2:]) < 1:
        return None
    return reduce_to(image, max_size)


def decode_on_device(
    encoded: list[torch.Tensor], device: torch.device, max_size: int | None = None
) -> list[torch.Tensor | None]:
    """Decode a batch of encoded images on ``device``: JPEGs in one nvJPEG call on a CUDA device.

    Everything else (a non-JPEG, a JPEG nvJPEG refuses, any image on a non-CUDA device) is
    decoded by :func:`decode_rgb` on the CPU and moved to ``device``. Corrupt files give None.

    Shape:
        encoded: B tensors (L_i,) uint8 on the CPU; returns B tensors (3, H_i, W_i) uint8 on ``device``.
    """
    images: list[torch.Tensor | None] = [None] * len(encoded)
    jpegs = [i for i, data in enumerate(encoded) if is_jpeg(data)] if device.type == "cuda" else []
    if jpegs:
        try:
            with _quiet():
                decoded = decode_jpeg([encoded[i] for i in jpegs], mode=ImageReadMode.RGB, device=device)
            for i, image in zip(jpegs, decoded):
                images[i] = reduce_to(image, max_size)
        except RuntimeError:  # one bad JPEG fails the whole call: every file is then decoded below, one by one
            pass
    for i, data in enumerate(encoded):
        if images[i] is None:
            image = decode_rgb(data, max_size)
            images[i] = image.to(device, non_blocking=True) if image is not None else None
    return images
