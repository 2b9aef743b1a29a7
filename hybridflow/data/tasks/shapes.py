"""Built-in task ``shapes``: a visual question about a small drawn image, for vision-language models.

Each row holds one image (Pillow, ``image_size`` pixels square, white background) and one of two
questions:

* ``count`` — ``N`` dots (``min_dots``..``max_dots``, coloured from :data:`COLOURS`, never
  overlapping): "How many dots are in the image?"; the ground truth is ``N`` as digits (``"3"``);
* ``colour`` — one filled square of a colour of :data:`COLOURS`, of random size and place: "What
  colour is the square?"; the ground truth is the colour's name (``"red"``).

Rows are in verl's multimodal layout (:mod:`hybridflow.data.multimodal`): the prompt is one user
message ``"<image>" + question``, the ``images`` column one ``{"bytes": PNG, "path": ...}``
entry. Answers are drawn uniformly (count, then colour); everything comes from one seeded
generator, so equal arguments give equal rows (and equal PNG bytes with the same Pillow). No
image occurs twice: test images never appear in the training split.

``hybridflow data shapes --out DIR`` writes the PNG files under ``DIR/images/`` and the rows
twice: ``*.jsonl`` refer to the files by path (JSON holds no bytes) and ``*.parquet`` carry the
PNG bytes too (as Hugging Face ``datasets`` writes images; a self-contained file), plus
``sft.parquet`` / ``sft.jsonl``: the training rows as ``messages`` conversations (the answer as
the assistant turn) with the same images, for SFT with images.

The scorer of ``hybridflow/shapes`` rows is ``hybridflow/reward/scorers/shapes.py`` (it uses the
reward side's ``\\boxed{}`` reader, which this layer may not import).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from hybridflow import fields as F
from hybridflow.data.io import write_rows
from hybridflow.data.multimodal import IMAGE_PLACEHOLDER
from hybridflow.data.tasks.common import Rows, TaskSpec, add_size_arguments, make_row

DATA_SOURCE = "hybridflow/shapes"
ABILITY = "visual"
IMAGE_KEY = "images"
IMAGE_DIR = "images"
SFT_SPLIT = "sft"
MESSAGES_KEY = "messages"
KINDS: tuple[str, ...] = ("count", "colour")
# Names and RGB values far apart, so a resized image keeps them distinguishable.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (40, 70, 220),
    "yellow": (235, 200, 0),
    "purple": (140, 40, 170),
    "black": (0, 0, 0),
}
QUESTIONS: dict[str, str] = {
    "count": "How many dots are in the image? Answer with the number only.",
    "colour": "What colour is the square? Answer with the colour only.",
}


@dataclass(frozen=True)
class ShapesSettings:
    """What the images and questions look like."""

    image_size: int = 56
    kinds: tuple[str, ...] = KINDS
    min_dots: int = 1
    max_dots: int = 6

    def __post_init__(self) -> None:
        if not 28 <= self.image_size <= 448:
            raise ValueError(f"image_size must be in 28..448 pixels, got {self.image_size}")
        if not self.kinds or any(kind not in KINDS for kind in self.kinds):
            raise ValueError(f"kinds must be a non-empty selection of {', '.join(KINDS)}, got {self.kinds!r}")
        if not 1 <= self.min_dots <= self.max_dots <= 12:
            raise ValueError(f"need 1 <= min_dots <= max_dots <= 12, got {self.min_dots}..{self.max_dots}")

    @property
    def dot_radius(self) -> int:
        """Dots scale with the image: 4 pixels at 56 (a 14-pixel patch holds one dot)."""
        return max(2, self.image_size // 14)


def draw_dots(rng: random.Random, count: int, settings: ShapesSettings) -> Image.Image:
    """``count`` non-overlapping dots of random colours at random places."""
    size, r = settings.image_size, settings.dot_radius
    for _ in range(1000):  # rejection sampling of the whole layout; a full image retries
        centres: list[tuple[int, int]] = []
        for _ in range(200):
            x, y = rng.randint(r + 1, size - r - 2), rng.randint(r + 1, size - r - 2)
            if all((x - a) ** 2 + (y - b) ** 2 >= (2 * r + 3) ** 2 for a, b in centres):
                centres.append((x, y))
                if len(centres) == count:
                    break
        if len(centres) == count:
            break
    else:
        raise ValueError(f"cannot place {count} dots of radius {r} in {size}x{size} pixels; lower max_dots")
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    for x, y in centres:
        draw.ellipse((x - r, y - r, x + r, y + r), fill=COLOURS[rng.choice(list(COLOURS))])
    return image


def draw_square(rng: random.Random, colour: str, settings: ShapesSettings) -> Image.Image:
    """One filled square of ``colour``, its side 30–60% of the image, at a random place."""
    size = settings.image_size
    side = rng.randint(max(4, size * 3 // 10), max(4, size * 6 // 10))
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    image = Image.new("RGB", (size, size), "white")
    ImageDraw.Draw(image).rectangle((x, y, x + side - 1, y + side - 1), fill=COLOURS[colour])
    return image


def png_bytes(image: Image.Image) -> bytes:
    """The image encoded as PNG."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def make_problem(rng: random.Random, settings: ShapesSettings) -> tuple[str, str, Image.Image]:
    """``(kind, answer, image)`` of one random problem."""
    kind = rng.choice(settings.kinds)
    if kind == "count":
        count = rng.randint(settings.min_dots, settings.max_dots)
        return kind, str(count), draw_dots(rng, count, settings)
    colour = rng.choice(list(COLOURS))
    return kind, colour, draw_square(rng, colour, settings)


def generate_shapes(
    num_train: int, num_test: int, *, seed: int = 0, settings: ShapesSettings = ShapesSettings()
) -> tuple[Rows, Rows]:
    """``(train_rows, test_rows)`` with the PNG bytes inline (``{"bytes": ..., "path": None}``);
    no image (compared pixel for pixel) occurs twice in or across the splits."""
    if num_train < 0 or num_test < 0:
        raise ValueError(f"sizes must be >= 0, got train={num_train} test={num_test}")
    rng = random.Random(seed)
    seen: set[bytes] = set()
    splits = []
    for split, count in (("test", num_test), ("train", num_train)):
        rows: Rows = []
        for _ in range(50 * count + 1000):
            if len(rows) == count:
                break
            kind, answer, image = make_problem(rng, settings)
            digest = hashlib.sha256(image.tobytes()).digest()
            if digest not in seen:
                seen.add(digest)
                rows.append(_row(kind, answer, png_bytes(image), split, len(rows)))
        if len(rows) < count:
            raise ValueError(f"found only {len(rows)} of {count} distinct {split} images for {settings}")
        splits.append(rows)
    test, train = splits
    return train, test


def _row(kind: str, answer: str, png: bytes, split: str, index: int) -> dict[str, Any]:
    row = make_row(
        data_source=DATA_SOURCE,
        question=IMAGE_PLACEHOLDER + QUESTIONS[kind],
        ground_truth=answer,
        split=split,
        index=index,
        ability=ABILITY,
        extra={"kind": kind},
    )
    return {**row, IMAGE_KEY: [{"bytes": png, "path": None}]}


def image_path(split: str, index: int) -> str:
    """Where the CLI writes a row's image, relative to the output folder."""
    return f"{IMAGE_DIR}/{split}-{index:05d}.png"


def with_image_files(rows: Rows, *, keep_bytes: bool) -> Rows:
    """``rows`` whose image entries name their file (:func:`image_path`), the bytes kept or not."""
    out = []
    for row in rows:
        extra = row[F.EXTRA_INFO]
        (image,) = row[IMAGE_KEY]
        entry = {"bytes": image["bytes"] if keep_bytes else None, "path": image_path(extra["split"], extra["index"])}
        out.append({**row, IMAGE_KEY: [entry]})
    return out


def sft_rows(rows: Rows) -> Rows:
    """``rows`` as SFT conversations (the RL prompt, then the answer as the assistant turn),
    with the same images: verl's multi-turn SFT layout (``messages`` and ``images`` columns)."""
    return [
        {
            MESSAGES_KEY: [*row["prompt"], {"role": "assistant", "content": row[F.REWARD_MODEL]["ground_truth"]}],
            IMAGE_KEY: row[IMAGE_KEY],
            F.DATA_SOURCE: row[F.DATA_SOURCE],
            F.EXTRA_INFO: row[F.EXTRA_INFO],
        }
        for row in rows
    ]


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    add_size_arguments(parser, train_size=2000, test_size=200)
    parser.add_argument("--image-size", type=int, default=56, help="image side in pixels (default 56)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"question kinds, comma-separated ({','.join(KINDS)})")
    parser.add_argument("--min-dots", type=int, default=1, help="fewest dots of a count question (default 1)")
    parser.add_argument("--max-dots", type=int, default=6, help="most dots of a count question (default 6)")


def _generate(args: argparse.Namespace) -> tuple[Rows, Rows]:
    if getattr(args, "prompt_template", None) is not None:
        raise ValueError("shapes rows have images, which need the chat template; --prompt-template cannot be used")
    kinds = tuple(kind.strip() for kind in args.kinds.split(",") if kind.strip())
    settings = ShapesSettings(image_size=args.image_size, kinds=kinds, min_dots=args.min_dots, max_dots=args.max_dots)
    return generate_shapes(args.train_size, args.test_size, seed=args.seed, settings=settings)


def _build(args: argparse.Namespace) -> tuple[Rows, Rows]:
    train, test = _generate(args)  # the JSON-lines copy: images by path, written by _write_extra
    return with_image_files(train, keep_bytes=False), with_image_files(test, keep_bytes=False)


def _write_extra(args: argparse.Namespace, out_dir: Path) -> list[Path]:
    """The PNG files, the parquet splits again with the bytes inline, and the SFT split."""
    train, test = _generate(args)  # deterministic: the rows _build returned, with their bytes
    (out_dir / IMAGE_DIR).mkdir(parents=True, exist_ok=True)
    for row in (*train, *test):
        extra = row[F.EXTRA_INFO]
        (out_dir / image_path(extra["split"], extra["index"])).write_bytes(row[IMAGE_KEY][0]["bytes"])
    for split, rows in (("train", train), ("test", test)):  # already listed as written: not returned again
        write_rows(with_image_files(rows, keep_bytes=True), out_dir / f"{split}.parquet")
    return [
        out_dir / IMAGE_DIR,
        write_rows(sft_rows(with_image_files(train, keep_bytes=True)), out_dir / f"{SFT_SPLIT}.parquet"),
        write_rows(sft_rows(with_image_files(train, keep_bytes=False)), out_dir / f"{SFT_SPLIT}.jsonl"),
    ]


TASK = TaskSpec(
    name="shapes",
    help="a visual question (count the dots, name the square's colour) about a small drawn image; for VLMs",
    add_arguments=_add_arguments,
    build=_build,
    write_extra=_write_extra,
)
