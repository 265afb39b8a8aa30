"""Models of clearly different compute and communication weight (gradient bytes per iteration).

| name        | digits (1x8x8) | mnist (1x28x28) | cifar10 (3x32x32) | character                     |
| ----------- | -------------- | --------------- | ----------------- | ----------------------------- |
| mlp-small   | 85 k params    | 269 k           | 855 k             | light compute, light comm.    |
| cnn         | 101 k          | 101 k           | 102 k             | heavier compute per parameter |
| mlp-medium  | 301 k          | 669 k           | 1.84 M            | medium communication          |
| mlp-large   | 2.24 M         | 3.72 M          | 8.40 M            | heavy communication           |
| resnet18    | 11.17 M        | 11.17 M         | 11.17 M           | heavy compute, heavy comm.    |
| mobilenetv2 | 2.24 M         | 2.24 M          | 2.24 M            | heavy compute, medium comm.   |
| transformer | 0.80 M         | 0.80 M          | 0.81 M            | attention over image rows     |

ResNet-18 and MobileNetV2 are torchvision's architectures (same modules, names and
initialisation, so torchvision's state dicts fit them: 11,689,512 and 3,504,872 parameters at
1000 classes on RGB, as torchvision's model docs say), written out here because the only
torchvision wheel at hand is a CUDA build that cannot load against the CPU torch
(`import torchvision` fails: "operator torchvision::nms does not exist"). For inputs smaller than
64 px they get the usual CIFAR adaptation: a 3x3 stride-1 stem and no max-pool (ResNet), stride
1 in the stem and the first 24-channel stage (MobileNetV2), so a 32x32 image ends at 4x4 rather
than 1x1. `transformer` reads an image as a sequence of its rows (a token per row: sequential
MNIST/CIFAR), through a torch.nn.TransformerEncoder.

Every model takes (N, C, H, W) images and returns class logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

ModelFactory = Callable[[tuple[int, int, int], int], nn.Module]
# Below this side torchvision's ImageNet stem (/4 before the first stage) leaves too little image.
SMALL_INPUT_PX = 64


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


# --- ResNet-18 (torchvision.models.resnet18) ------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = (
            nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )
            if stride != 1 or inplanes != planes
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, input_shape: tuple[int, int, int], classes: int) -> None:
        super().__init__()
        channels, h, w = input_shape
        if min(h, w) < SMALL_INPUT_PX:
            self.conv1 = nn.Conv2d(channels, 64, 3, 1, padding=1, bias=False)
            self.maxpool: nn.Module = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(channels, 64, 7, 2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(3, 2, padding=1)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        self.layer1, self.layer2, self.layer3, self.layer4 = (
            nn.Sequential(BasicBlock(i, o, s), BasicBlock(o, o, 1)) for i, o, s in widths
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# --- MobileNetV2 (torchvision.models.mobilenet_v2, width 1.0) --------------------------------------
def _conv_bn_relu6(inp: int, out: int, kernel: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(inp, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, out: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = inp * expand_ratio
        self.use_res_connect = stride == 1 and inp == out
        layers = [_conv_bn_relu6(inp, hidden, 1, 1)] if expand_ratio != 1 else []
        self.conv = nn.Sequential(
            *layers,
            _conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, out, 1, 1, 0, bias=False),
            nn.BatchNorm2d(out),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    # (expansion t, channels c, blocks n, stride s of the first block): the paper's table 2
    SETTING = [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ]

    def __init__(self, input_shape: tuple[int, int, int], classes: int) -> None:
        super().__init__()
        channels, h, w = input_shape
        small = min(h, w) < SMALL_INPUT_PX
        features: list[nn.Module] = [_conv_bn_relu6(channels, 32, 3, 1 if small else 2)]
        inp = 32
        for t, c, n, s in self.SETTING:
            first = 1 if small and c == 24 else s
            for i in range(n):
                features.append(InvertedResidual(inp, c, first if i == 0 else 1, t))
                inp = c
        features.append(_conv_bn_relu6(inp, 1280, 1, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


# --- a small Transformer encoder over image rows -----------------------------------------------
class RowTransformer(nn.Module):
    """Each image row (all channels) is a token: H tokens of C·W values, a learned position per
    row, 4 pre-norm encoder layers of width 128 (4 heads), mean over tokens, a linear head."""

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        classes: int,
        width: int = 128,
        heads: int = 4,
        layers: int = 4,
    ) -> None:
        super().__init__()
        channels, h, w = input_shape
        self.embed = nn.Linear(channels * w, width)
        self.position = nn.Parameter(torch.zeros(1, h, width))
        nn.init.normal_(self.position, std=0.02)
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=4 * width, batch_first=True, norm_first=True
        )
        # enable_nested_tensor only applies to post-norm layers (a warning otherwise).
        self.encoder = nn.TransformerEncoder(
            layer, layers, norm=nn.LayerNorm(width), enable_nested_tensor=False
        )
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        tokens = x.permute(0, 2, 1, 3).reshape(n, h, c * w)  # row r: channels × columns
        return self.head(self.encoder(self.embed(tokens) + self.position).mean(dim=1))


MODELS: dict[str, ModelFactory] = {
    "mlp-small": mlp((256, 256)),
    "cnn": small_cnn,
    "mlp-medium": mlp((512, 512)),
    "mlp-large": mlp((2048, 1024)),
    "resnet18": ResNet18,
    "mobilenetv2": MobileNetV2,
    "transformer": RowTransformer,
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


def ddp_buckets(model: nn.Module) -> list[int]:
    """Bytes of each gradient bucket DistributedDataParallel all-reduces, in the order it launches
    them: the parameters in reverse (the order the backward pass produces their gradients),
    packed by DDP's own rule and caps — a first bucket of `dist._DEFAULT_FIRST_BUCKET_BYTES`
    (1 MiB), then 25 MiB (DDP's `bucket_cap_mb`) —, a parameter larger than the cap a bucket to
    itself. ResNet-18 on CIFAR-10: 9.46, 26.49 and 8.74 MB (a test checks it against DDP's
    communication hook)."""
    import torch.distributed as dist

    params = [p for p in reversed(list(model.parameters())) if p.requires_grad]
    caps = [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 1024 * 1024]
    buckets, _ = dist._compute_bucket_assignment_by_size(params, caps, [False] * len(params))
    return [sum(params[i].numel() * params[i].element_size() for i in b) for b in buckets]
