"""An export's model card: a README.md as the Hugging Face hub and timm read one (YAML front matter with
``library_name``, ``pipeline_tag`` and ``tags``, then Markdown), from what the export records
(:func:`sslkit.models.export.export_metadata`) and the run's ``results.json``.

The card says what the network is, the input it expects, the run's results, how to load it, and
where it came from: the command that made it, the run, its step and its recipe. No ``license``: the
weights' terms follow from the data they were trained on, which sslkit cannot know.
"""

from __future__ import annotations

from sslkit.models.expected_input import ExpectedInput


def model_card(fmt: str, metadata: dict[str, str], summary: dict | None, name: str) -> str:
    """The export's model card, as the Hugging Face hub and timm read one (YAML front matter, then Markdown):
    what the network is, the input it expects, the run's results (its ``results.json``), how to load it and
    where it came from (the command that made it and the run's recipe). ``summary``: the run's results.json (None:
    it has none); ``name``: the export's file name."""
    source = {key.removeprefix("source."): value for key, value in metadata.items() if key.startswith("source.")}
    expected = ExpectedInput.from_metadata(metadata)
    library = {"safetensors": "sslkit", "timm": "timm", "onnx": "onnx"}[fmt]
    tags = dict.fromkeys(["image-feature-extraction", "sslkit", source["method"], source["loss"], fmt])
    front = ["---", f"library_name: {library}", "pipeline_tag: image-feature-extraction", "tags:"]
    front += [f"- {tag}" for tag in tags] + ["---"]
    lines = [
        f"# {source['name']}: {source['method']} on {source['data']}",
        "",
        f"An image encoder ({metadata['sslkit.model']}) trained by sslkit with method `{source['method']}` and loss "
        f"`{source['loss']}` on `{source['data']}`, {_step(source)}. It maps an image to "
        f"{metadata['output.features']} features (no classifier).",
        "",
        "## Input",
        "",
        *_input_lines(expected),
        "",
        "## Results",
        "",
        *_results_lines(summary),
        "",
        "## Use",
        "",
        *_use_lines(fmt, name),
        "",
        "## Where it came from",
        "",
        f"`{source['command']}` (sslkit {source['sslkit']}), from `{source['weights']}` of the run `{source['run']}`.",
        "",
        "<details><summary>The run's recipe (config.yaml)</summary>",
        "",
        "```yaml",
        source["recipe"].rstrip(),
        "```",
        "",
        "</details>",
    ]
    return "\n".join(front + lines) + "\n"


def _step(source: dict[str, str]) -> str:
    return f"step {source['step']}" if source.get("step") else "step unknown"


def _input_lines(expected: ExpectedInput) -> list[str]:
    size = expected.image_size
    kind = "grey" if expected.channels == 1 else "RGB"
    lines = [
        f"- {expected.channels} channel{'s' if expected.channels > 1 else ''} ({kind}), {size} x {size} pixels: the "
        f"central square of an image resized to {size} ({expected.interpolation}, antialiased when shrinking)",
        "- pixel values in [0, 1] (uint8 / 255)",
    ]
    if expected.normalize:
        mean, std = (", ".join(f"{value:.4f}" for value in values) for values in (expected.mean, expected.std))
        lines.append(f"- then `(x - mean) / std` per channel: mean {mean}, std {std} (the training data's)")
    else:
        lines.append("- not normalised (the run trained with `augment.normalize: false`)")
    return lines


def _results_lines(summary: dict | None) -> list[str]:
    results = (summary or {}).get("results")
    if not results:
        return ["The run has no results.json (it was not evaluated, or has not finished)."]
    rows = list(results)
    metrics = list(dict.fromkeys(metric for row in rows for metric in results[row]))
    table = ["| metric | " + " | ".join(rows) + " |", "|---" * (len(rows) + 1) + "|"]
    for metric in metrics:
        cells = [_number(results[row].get(metric)) for row in rows]
        table.append(f"| {metric} | " + " | ".join(cells) + " |")
    return [f"The run's final evaluation (its results.json, step {summary.get('step')}):", "", *table]


def _number(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else "" if value is None else str(value)


def _use_lines(fmt: str, name: str) -> list[str]:
    if fmt == "timm":
        code = [
            "import timm",
            "",
            'model = timm.create_model("local-dir:.", pretrained=True).eval()  # this folder',
            "transform = timm.data.create_transform(**timm.data.resolve_data_config(model=model))",
            "features = model(transform(image).unsqueeze(0))  # image: a PIL image",
        ]
    else:
        code = [
            "from sslkit.models.export import load_export",
            "",
            f'model, preprocess = load_export("{name}")',
            "features = model(preprocess(images))  # images: uint8 (N, C, H, W)",
        ]
    return ["```python", *code, "```"]
