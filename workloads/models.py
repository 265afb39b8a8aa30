"""Models of clearly different communication weight (gradient bytes per iteration).

| name      | digits (8x8) | mnist (28x28) | character                                   |
| --------- | ------------ | ------------- | ------------------------------------------- |
| mlp-small | 85 k params  | 269 k         | light compute, light communication          |
| cnn       | 101 k        | 101 k         | heavier compute per parameter, light comm.  |
| mlp-medium| 301 k        | 669 k         | light compute, medium communication (~1 MB) |
| mlp-large | 2.24 M       | 3.72 M        | light compute, heavy communication (~9 MB)  |

Every model takes (N, 1, H, W) images and returns class logits, for any image size.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

ModelFactory = Callable[[tuple[int, int, int], int], nn.Module]


def mlp(hidden: tuple[int, ...]) -> ModelFactory:
    def build(input_shape: tuple[int, int, int], classes: int) -> nn.Module:
        c, h, w = input_shape
        layers: list[nn.Module] = [nn.Flatten()]
        width = c * h * w
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, classes))
        return nn.Sequential(*layers)

    return build


def small_cnn(input_shape: tuple[int, int, int], classes: int) -> nn.Module:
    # Adaptive pooling makes the parameter count independent of the image size.
    return nn.Sequential(
        nn.Conv2d(input_shape[0], 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(64 * 4 * 4, 80),
        nn.ReLU(),
        nn.Linear(80, classes),
    )


MODELS: dict[str, ModelFactory] = {
    "mlp-small": mlp((256, 256)),
    "cnn": small_cnn,
    "mlp-medium": mlp((512, 512)),
    "mlp-large": mlp((2048, 1024)),
}


def build_model(name: str, input_shape: tuple[int, int, int], classes: int) -> nn.Module:
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}' (expected one of {', '.join(MODELS)})")
    return MODELS[name](input_shape, classes)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of one full gradient: what one all-reduce (or one push to a PS) carries."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
