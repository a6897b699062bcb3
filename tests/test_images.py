"""The image pieces of the data stage, table-driven on images made here with Pillow: what is
accepted, what is refused and why, the record's keys, and the statistics."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from conftest import run_cli
from tfpipe.pipeline.config import parse_size
from tfpipe.pipeline.images import ImageInfo, ImageStats, Rejection, image_example, inspect_image, sniff_format


def encode(fmt: str, size=(20, 30), mode="RGB", color=(200, 40, 10), frames: int = 1) -> bytes:
    """An image of `size` (height, width) in `fmt` (Pillow's format name)."""
    h, w = size
    pixels = np.zeros((h, w, 3), dtype=np.uint8)
    pixels[...] = color
    pixels[: h // 2, : w // 2] = (255 - np.array(color)).astype(np.uint8)  # not flat, so JPEG has work to do
    image = Image.fromarray(pixels).convert(mode)
    out = io.BytesIO()
    if frames > 1:
        others = [Image.new(mode, (w, h), 0) for _ in range(frames - 1)]
        image.save(out, format=fmt, save_all=True, append_images=others)
    else:
        image.save(out, format=fmt)
    return out.getvalue()


JPEG = encode("JPEG")
PNG = encode("PNG")


@pytest.mark.parametrize("data, fmt, size", [
    (JPEG, "jpeg", (20, 30)),
    (PNG, "png", (20, 30)),
    (encode("PNG", mode="RGBA"), "png", (20, 30)),
    (encode("PNG", mode="L", size=(9, 7)), "png", (9, 7)),
    (encode("BMP"), "bmp", (20, 30)),
    (encode("GIF", frames=3), "gif", (20, 30)),
], ids=["jpeg", "png", "png-rgba", "png-grey", "bmp", "gif-animated"])
def test_accepted_images_keep_their_bytes(data, fmt, size):
    info = inspect_image(data)
    assert isinstance(info, ImageInfo), info
    assert (info.format, (info.height, info.width)) == (fmt, size)
    assert info.encoded is data  # no re-encode without a resize
    assert info.pixels == size[0] * size[1]
    # integer sums of 0-255 values: a square is never below its value, nor over 255 times it
    assert np.all(info.channel_sum >= 0) and np.all(info.channel_sum <= info.channel_sumsq)
    assert np.all(info.channel_sumsq <= 255 * info.channel_sum) and info.channel_sum.dtype == np.int64


@pytest.mark.parametrize("data, reason", [
    (b"", "empty file (0 bytes)"),
    (b"species,island\nAdelie,Biscoe\n", "unsupported format (first bytes 737065636965732"),
    (JPEG[: len(JPEG) // 2], "truncated jpeg file"),
    (PNG[: len(PNG) - 30], "truncated png file"),
    (PNG[:40], "undecodable png file"),
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "undecodable png file"),
    (b"\xff\xd8\xff" + b"\x17" * 64, "undecodable jpeg file"),
], ids=["empty", "csv", "jpeg-truncated", "png-truncated", "png-header-only", "png-garbage", "jpeg-garbage"])
def test_refused_images_say_why(data, reason):
    verdict = inspect_image(data)
    assert isinstance(verdict, Rejection), verdict
    assert reason in verdict.reason, verdict.reason
    assert "\n" not in verdict.reason


def test_the_minimum_size_counts_height_and_width():
    assert isinstance(inspect_image(PNG, min_size=(20, 30)), ImageInfo)
    small = inspect_image(PNG, min_size=(21, 8))
    assert isinstance(small, Rejection) and small.reason == "image is 20x30, smaller than the minimum 21x8"
    assert isinstance(inspect_image(PNG, min_size=(8, 31)), Rejection)


@pytest.mark.parametrize("data, fmt", [(JPEG, "jpeg"), (PNG, "png"), (encode("GIF", frames=2), "png"),
                                       (encode("BMP"), "png")], ids=["jpeg", "png", "gif", "bmp"])
def test_resize_re_encodes_at_the_asked_size(data, fmt):
    info = inspect_image(data, resize=(6, 10))
    assert isinstance(info, ImageInfo)
    assert (info.format, info.height, info.width, info.pixels) == (fmt, 6, 10, 60)
    decoded = Image.open(io.BytesIO(info.encoded))
    assert decoded.size == (10, 6) and decoded.format.lower() == fmt
    assert inspect_image(PNG, resize=(20, 30)).encoded is PNG  # already that size: kept as is


def test_record_has_the_conventional_keys_and_decodes_in_tensorflow():
    import tensorflow as tf

    info = inspect_image(PNG)
    record = tf.train.Example.FromString(image_example(info, 2, "Gentoo"))
    f = record.features.feature
    assert f["image/encoded"].bytes_list.value == [PNG]
    assert f["image/format"].bytes_list.value == [b"png"]
    assert (f["image/height"].int64_list.value, f["image/width"].int64_list.value) == ([20], [30])
    assert f["image/class/label"].int64_list.value == [2]
    assert f["image/class/text"].bytes_list.value == ["Gentoo".encode()]
    pixels = tf.io.decode_image(f["image/encoded"].bytes_list.value[0], channels=3).numpy()
    assert np.array_equal(pixels, np.asarray(Image.open(io.BytesIO(PNG)).convert("RGB")))


def test_stats_give_class_counts_sizes_and_channel_moments_and_merge():
    white = inspect_image(encode("PNG", size=(2, 2), color=(255, 255, 255), mode="L"))
    black = inspect_image(encode("PNG", size=(4, 2), color=(0, 0, 0), mode="L"))
    # encode() paints a quarter in the inverse colour: 1 of white's 4 pixels is black, 2 of black's 8 white.
    whole = ImageStats()
    for info, label in ((white, "a"), (black, "b"), (black, "b")):
        whole.add(info, label)
    left, right = ImageStats(), ImageStats()
    left.add(white, "a")
    right.add(black, "b")
    right.add(black, "b")
    merged = left.merge(right).to_json()
    out = whole.to_json()
    assert merged == out
    assert out["images"] == 3 and out["classes"] == {"a": 1, "b": 2} and out["formats"] == {"png": 3}
    assert out["height"]["quantiles"][0] == 2 and out["height"]["quantiles"][-1] == 4
    ones = 3 + 2 + 2  # white pixels over the 20 pixels
    assert out["channels"]["pixels"] == 20
    assert out["channels"]["mean"] == [round(ones / 20, 6)] * 3
    assert out["channels"]["std"] == [round(float(np.sqrt(ones / 20 - (ones / 20) ** 2)), 6)] * 3
    assert ImageStats().to_json()["channels"]["mean"] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("text, expected", [("224x224", (224, 224)), ("64", (64, 64)), ("32X48", (32, 48)),
                                            ("0x4", "both above 0"), ("axb", "is not a size"),
                                            ("1x2x3", "is not a size")])
def test_sizes_parse_or_say_what_is_wrong(text, expected):
    if isinstance(expected, tuple):
        assert parse_size(text) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            parse_size(text)


@pytest.mark.parametrize("head, fmt", [(JPEG[:16], "jpeg"), (PNG[:16], "png"), (b"GIF87a....", "gif"),
                                       (b"GIF89a....", "gif"), (b"BM\x00\x00", "bmp"), (b"RIFF....WEBP", None),
                                       (b"", None)])
def test_format_comes_from_the_first_bytes(head, fmt):
    assert sniff_format(head) == fmt


# ---- `tfpipe data --format images`, through the CLI -------------------------------------------

def _folder(root, per_class: int = 10) -> None:
    """ROOT/{cat,dog,owl}/ with PNG and JPEG images of 16x20, plus one bad file of each kind."""
    rng = np.random.default_rng(0)
    for c in ("cat", "dog", "owl"):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            pixels = (rng.random((16, 20, 3)) * 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"{c}/{i}.{'png' if i % 2 else 'jpg'}")
    (root / "cat" / "empty.jpg").write_bytes(b"")
    (root / "dog" / "notes.jpg").write_text("not an image")
    whole = (root / "owl" / "1.png").read_bytes()
    (root / "owl" / "cut.png").write_bytes(whole[: len(whole) // 2])
    Image.new("RGB", (4, 4)).save(root / "owl" / "tiny.png")
    (root / "README.txt").write_text("outside the class folders: not an input")


def _records(out) -> dict[str, list]:
    import tensorflow as tf

    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64),
            "image/class/text": tf.io.FixedLenFeature([], tf.string),
            "image/height": tf.io.FixedLenFeature([], tf.int64)}
    found = {}
    for split in ("train", "eval", "test"):
        files = sorted(str(p) for p in out.glob(f"{split}-*.tfrecord.gz"))
        found[split] = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(files, "GZIP")]
    return found


def test_image_folder_every_file_written_or_dead_lettered_with_its_reason(tmp_path):
    _folder(tmp_path / "src")
    out = tmp_path / "out"
    res = run_cli("data", "--format", "images", "--input", str(tmp_path / "src"), "--out", str(out),
                  "--min-size", "8x8", "--max-bad-fraction", "0.2", "--shards", "2")
    assert res.returncode == 0, res.stderr
    assert "1 file(s) outside the class subfolders are not inputs" in res.stdout
    manifest = json.loads((out / "data.json").read_text())
    assert manifest["counts"]["read"] == 34 and manifest["counts"]["bad"] == 4
    assert manifest["counts"]["written"] == 30 == sum(manifest["counts"]["splits"].values())
    dead = [json.loads(line) for p in sorted(out.glob("deadletter/*.jsonl")) for line in p.read_text().splitlines()]
    reasons = {d["source"]: d["reason"] for d in dead}
    assert reasons == {
        "cat/empty.jpg": "empty file (0 bytes)",
        "dog/notes.jpg": "unsupported format (first bytes 6e6f7420616e2069; accepted: jpeg, png, gif, bmp)",
        "owl/cut.png": "truncated png file: image file is truncated",
        "owl/tiny.png": "image is 4x4, smaller than the minimum 8x8",
    }
    assert all(d["path"].startswith(str(tmp_path)) for d in dead)
    schema = json.loads((out / "schema.json").read_text())
    assert schema["kind"] == "images" and schema["label"]["classes"] == ["cat", "dog", "owl"]

    records = _records(out)
    assert sum(len(r) for r in records.values()) == 30
    import tensorflow as tf

    by_split, train_pixels = {}, []
    for split, rows in records.items():
        for r in rows:
            text = r["image/class/text"].numpy().decode()
            assert schema["label"]["classes"][int(r["image/class/label"])] == text
            pixels = tf.io.decode_image(r["image/encoded"], channels=3).numpy()
            assert pixels.shape == (16, 20, 3) and int(r["image/height"]) == 16
            by_split.setdefault(split, []).append(text)
            if split == "train":  # Pillow's decoding (TensorFlow's JPEG decoder rounds differently)
                decoded = Image.open(io.BytesIO(r["image/encoded"].numpy())).convert("RGB")
                train_pixels.append(np.asarray(decoded).reshape(-1, 3) / 255.0)
    stats = json.loads((out / "stats.json").read_text())
    for split, texts in by_split.items():
        assert stats["splits"][split]["classes"] == {c: texts.count(c) for c in sorted(set(texts))}
    # Per-channel moments of the train split's pixels, in [0, 1] (the model's normalisation).
    channels, train_pixels = stats["splits"]["train"]["channels"], np.concatenate(train_pixels)
    assert channels["pixels"] == len(train_pixels)
    assert np.allclose(channels["mean"], train_pixels.mean(axis=0), atol=1e-6)
    assert np.allclose(channels["std"], train_pixels.std(axis=0), atol=1e-6)

    # The split follows the file's path: more shards, the same images in each split.
    again = tmp_path / "again"
    assert run_cli("data", "--format", "images", "--input", str(tmp_path / "src"), "--out", str(again),
                   "--min-size", "8x8", "--max-bad-fraction", "0.2", "--shards", "3").returncode == 0
    assert {s: sorted(bytes(r["image/encoded"].numpy()) for r in rows) for s, rows in _records(again).items()} == \
        {s: sorted(bytes(r["image/encoded"].numpy()) for r in rows) for s, rows in records.items()}


def test_image_manifest_unknown_labels_missing_files_and_too_many_bad(tmp_path):
    _folder(tmp_path / "imgs", per_class=4)
    lines = ["image,label", "imgs/cat/0.jpg,cat", "imgs/dog/1.png,dog", "imgs/owl/2.jpg,owl", "imgs/cat/1.png,",
             "imgs/dog/0.jpg,wolf", "imgs/gone.png,cat", ",owl"]
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    res = run_cli("data", "--format", "images", "--input", str(tmp_path / "list.csv"), "--out", str(out),
                  "--classes", "cat", "dog", "owl", "--max-bad-fraction", "0.6")
    assert res.returncode == 0, res.stderr
    dead = {d["source"]: d["reason"] for p in out.glob("deadletter/*.jsonl")
            for d in map(json.loads, p.read_text().splitlines())}
    assert dead["imgs/cat/1.png"] == "no label"
    assert dead["imgs/dog/0.jpg"] == "unknown label 'wolf' (classes: cat, dog, owl)"
    assert dead["imgs/gone.png"].startswith("cannot read the file:")
    assert dead[""] == "no image path in the manifest row"
    assert json.loads((out / "data.json").read_text())["counts"] == {
        "read": 7, "written": 3, "bad": 4, "splits": json.loads((out / "data.json").read_text())["counts"]["splits"]}

    res = run_cli("data", "--format", "images", "--input", str(tmp_path / "list.csv"), "--out", str(tmp_path / "no"),
                  "--classes", "cat", "dog", "owl")
    assert res.returncode == 2 and "4 of 7 images are bad" in res.stderr and "unknown label 'wolf'" in res.stderr
    assert not (tmp_path / "no").exists()

    res = run_cli("data", "--format", "images", "--input", str(tmp_path / "list.csv"), "--out", str(tmp_path / "no"),
                  "--image-column", "file")
    assert res.returncode == 2 and "no column 'file' (columns: image, label); name it with --image-column" in res.stderr
    res = run_cli("data", "--format", "images", "--input", str(tmp_path / "imgs"), "--out", str(tmp_path / "no"),
                  "--resize", "0x3")
    assert res.returncode == 2 and "'0x3' is not a size" in res.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    res = run_cli("data", "--format", "images", "--input", str(tmp_path / "imgs"), "--out", str(tmp_path / "mine"),
                  "--max-bad-fraction", "0.5")
    assert res.returncode == 2 and "is not a tfpipe data output" in res.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_images_on_a_remote_filesystem(tmp_path, monkeypatch):
    """Class folders and the output on a non-local filesystem, as with gs:// on Dataflow: the
    listing, every read and every write go through Beam's FileSystems."""
    import remote_fs
    from tfpipe.pipeline.config import DataConfig
    from tfpipe.pipeline.job import run

    monkeypatch.setattr(remote_fs, "ROOT", str(tmp_path))
    _folder(tmp_path / "src", per_class=4)
    out = run(DataConfig(format="images", input=["testfs://src"], out="testfs://runs/images", min_size="8x8",
                         max_bad_fraction=0.5),
              log=lambda _: None).outputs.path
    assert out == "testfs://runs/images"
    manifest = json.loads((tmp_path / "runs" / "images" / "data.json").read_text())
    assert manifest["counts"]["read"] == 16 and manifest["counts"]["bad"] == 4  # 3 classes x 4 + 4 bad files
    dead = [json.loads(line) for p in (tmp_path / "runs" / "images").glob("deadletter/*.jsonl")
            for line in p.read_text().splitlines()]
    assert sorted(d["source"] for d in dead) == ["cat/empty.jpg", "dog/notes.jpg", "owl/cut.png", "owl/tiny.png"]
    assert all(d["path"].startswith("testfs://src/") for d in dead)
    assert sum(len(r) for r in _records(tmp_path / "runs" / "images").values()) == 12
