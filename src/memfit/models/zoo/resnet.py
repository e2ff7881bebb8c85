"""ResNet-18 and ResNet-50 in plain ``torch.nn`` (no torchvision).

The layout and the module names follow torchvision's ``resnet18`` / ``resnet50``
(ResNet v1.5: in a bottleneck block the stride sits on the 3x3 convolution), so
parameter and buffer counts are identical to torchvision's:

* resnet18: 11,689,512 parameters with a 1000-class ``fc``
* resnet50: 25,557,032 parameters with a 1000-class ``fc``
"""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet50"]


def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand, with a residual connection (ResNet-50+)."""

    expansion = 4

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ImageNet-style ResNet: 7x7 stem, max-pool, four stages, global average pool, linear head."""

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        layers: tuple[int, int, int, int],
        num_classes: int = 1000,
    ) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_stage(block, 64, layers[0], stride=1)
        self.layer2 = self._make_stage(block, 128, layers[1], stride=2)
        self.layer3 = self._make_stage(block, 256, layers[2], stride=2)
        self.layer4 = self._make_stage(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _make_stage(
        self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int, stride: int
    ) -> nn.Sequential:
        out_ch = planes * block.expansion
        downsample: nn.Module | None = None
        if stride != 1 or self.inplanes != out_ch:
            downsample = nn.Sequential(
                _conv1x1(self.inplanes, out_ch, stride), nn.BatchNorm2d(out_ch)
            )
        stage: list[nn.Module] = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = out_ch
        stage.extend(block(self.inplanes, planes) for _ in range(1, blocks))
        return nn.Sequential(*stage)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.avgpool(x).flatten(1)
        return self.fc(x)


def resnet18(num_classes: int = 1000) -> ResNet:
    """ResNet-18: BasicBlock stages of 2, 2, 2, 2 blocks."""
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes=num_classes)


def resnet50(num_classes: int = 1000) -> ResNet:
    """ResNet-50 (v1.5): Bottleneck stages of 3, 4, 6, 3 blocks."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes=num_classes)
