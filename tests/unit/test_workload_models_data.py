"""The real architectures (ResNet-18, MobileNetV2, a Transformer encoder), CIFAR-10's python
batches, full MNIST as bytes, and the synthetic stand-in for absent files (in-process)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from workloads.data import (
    DATASET_SHAPES,
    FILE_DATASETS,
    SYNTHETIC_TEST,
    DatasetError,
    as_float,
    check_available,
    load_dataset,
    read_cifar_batch,
    synthetic_dataset,
)
from workloads.models import build_model, ddp_buckets, gradient_bytes, parameter_count


@pytest.mark.parametrize("name, params", [("resnet18", 11_689_512), ("mobilenetv2", 3_504_872)])
def test_torchvision_architectures_have_torchvisions_parameters(name, params):
    """torchvision's model docs: resnet18 11,689,512 and mobilenet_v2 3,504,872 parameters (RGB
    224x224, 1000 classes); at that size the ImageNet stem is kept."""
    torch.manual_seed(0)
    model = build_model(name, (3, 224, 224), 1000).eval()
    assert parameter_count(model) == params
    with torch.no_grad():
        assert model(torch.zeros(1, 3, 224, 224)).shape == (1, 1000)


@pytest.mark.parametrize(
    "name, shape, params",
    [
        ("resnet18", (3, 32, 32), 11_173_962),
        ("resnet18", (1, 28, 28), 11_172_810),
        ("mobilenetv2", (3, 32, 32), 2_236_682),
        ("mobilenetv2", (1, 8, 8), 2_236_106),
        ("transformer", (3, 32, 32), 811_146),
        ("transformer", (1, 28, 28), 801_930),
    ],
)
def test_models_fit_small_inputs(name, shape, params):
    torch.manual_seed(0)
    model = build_model(name, shape, 10).eval()
    assert parameter_count(model) == params and gradient_bytes(model) == 4 * params
    with torch.no_grad():
        assert model(torch.rand(2, *shape)).shape == (2, 10)


def test_small_inputs_get_the_cifar_stem():
    """32x32: ResNet-18 keeps 32x32 into its first stage (3x3 stride-1 stem, no max-pool) and
    MobileNetV2 ends at 4x4 (stride 8), not torchvision's 1x1 (stride 32)."""
    resnet = build_model("resnet18", (3, 32, 32), 10)
    assert resnet.conv1.kernel_size == (3, 3) and resnet.conv1.stride == (1, 1)
    assert isinstance(resnet.maxpool, torch.nn.Identity)
    mobilenet = build_model("mobilenetv2", (3, 32, 32), 10).eval()
    with torch.no_grad():
        assert mobilenet.features(torch.zeros(1, 3, 32, 32)).shape == (1, 1280, 4, 4)
        big = build_model("mobilenetv2", (3, 224, 224), 10).eval()
        assert big.features(torch.zeros(1, 3, 224, 224)).shape == (1, 1280, 7, 7)


def test_transformer_reads_rows_as_tokens():
    """Rows are the tokens: without its learned positions the model sees a set of rows (their
    order cannot matter); with them, it sees their order."""
    torch.manual_seed(0)
    model = build_model("transformer", (1, 28, 28), 10).eval()
    x = torch.rand(1, 1, 28, 28)
    with torch.no_grad():
        base = model(x)
        zero_position = model.position.clone()
        model.position.zero_()  # no positions: a set of rows, so row order cannot matter
        swapped = x[:, :, [1, 0, *range(2, 28)], :]
        assert torch.allclose(model(x), model(swapped), atol=1e-5)
        model.position.copy_(zero_position)
        assert not torch.allclose(model(swapped), base, atol=1e-5)


def _cifar_batch(path, images: np.ndarray, labels: list[int]) -> None:
    """One batch as CIFAR-10's python version pickles it (bytes keys, rows of 3072 bytes)."""
    batch = {
        b"batch_label": b"testing batch",
        b"labels": labels,
        b"data": images.reshape(len(images), -1),
        b"filenames": [f"{i}.png".encode() for i in range(len(images))],
    }
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=2)


def test_cifar10_python_batches_are_read(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batches[name] = rng.integers(0, 256, (3, 3, 32, 32), dtype=np.uint8)
        _cifar_batch(folder / name, batches[name], [i % 10 for i in range(3)])
    check_available("cifar10", tmp_path)
    data = load_dataset("cifar10", tmp_path)
    assert data.x_train.shape == (15, 3, 32, 32) and data.x_test.shape == (3, 3, 32, 32)
    assert data.x_train.dtype == torch.uint8 and not data.synthetic and data.classes == 10
    # The red plane comes first, row-major: image 0 of batch 2 is training image 3.
    assert np.array_equal(data.x_train[3].numpy(), batches["data_batch_2"][0])
    assert np.array_equal(data.x_test.numpy(), batches["test_batch"])
    assert data.y_test.tolist() == [0, 1, 2]
    x = as_float(data.x_train[:2])
    assert x.dtype == torch.float32 and float(x.max()) <= 1.0
    assert torch.allclose(x * 255, data.x_train[:2].float())

    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(DatasetError, match="not a CIFAR-10 python batch"):
        read_cifar_batch(folder / "data_batch_3")
    _cifar_batch(folder / "data_batch_3", rng.integers(0, 256, (2, 3, 16, 16), np.uint8), [0, 1])
    with pytest.raises(DatasetError, match=r"expected \(N, 3072\)"):
        load_dataset("cifar10", tmp_path)
    (folder / "test_batch").unlink()
    with pytest.raises(DatasetError, match="CIFAR-10's python batches"):
        check_available("cifar10", tmp_path)


@pytest.mark.parametrize("name", sorted(FILE_DATASETS))
def test_synthetic_data_has_the_real_shapes_and_sizes(name):
    data = synthetic_dataset(name)
    (c, h, w), classes = DATASET_SHAPES[name]
    assert data.synthetic and data.name == name and data.classes == classes
    assert len(data.y_train) == FILE_DATASETS[name][0]
    assert len(data.y_test) == min(FILE_DATASETS[name][1], SYNTHETIC_TEST)
    assert data.x_train.shape[1:] == data.x_test.shape[1:] == (c, h, w)
    assert int(data.y_train.min()) == 0 and int(data.y_train.max()) == classes - 1
    assert torch.equal(synthetic_dataset(name).y_test, data.y_test)  # seeded


def test_ddp_buckets_are_the_buckets_ddp_all_reduces(tmp_path):
    """`ddp_buckets` against DDP itself: a one-rank gloo group, a communication hook recording
    each bucket's bytes in the order DDP hands them over (the second iteration's, after DDP
    has rebuilt its buckets in the order the gradients came)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = build_model("mlp-large", (1, 8, 8), 10)
    expected = ddp_buckets(model)
    assert len(expected) == 2 and sum(expected) == gradient_bytes(model)
    seen: list[int] = []

    def hook(state, bucket):
        seen.append(bucket.buffer().numel() * bucket.buffer().element_size())
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(None, hook)
        for _ in range(2):
            seen.clear()
            ddp(torch.randn(4, 1, 8, 8)).sum().backward()
    finally:
        dist.destroy_process_group()
    assert seen == expected
