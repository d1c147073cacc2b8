# The networks tools/compare-pytorch.sh times in PyTorch: CIFAR-style ResNet-20/32/44/56/110 as mgtrain builds them, and torchvision's ImageNet ResNets.
"""Model builders for the PyTorch side of the mgtrain comparison.

The CIFAR ResNets follow He et al. 2016 (section 4.2) exactly as mgtrain implements them:
a 3x3 stem convolution to 16 channels (stride 1, no max pool), three stages of BasicBlocks
with 16, 32 and 64 channels, stride 2 in the first block of stages 2 and 3, a 1x1
convolution + BatchNorm projection shortcut ("option B") wherever the shape changes,
global average pooling and a linear classifier. Parameter names match torchvision's
(conv1, bn1, layerS.B.conv1, layerS.B.downsample.0, fc), which are also mgtrain's, so
state dicts line up name for name with `mgtrain model --params`.
"""

import torch
import torch.nn as nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or cin != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, planes, 1, stride, 0, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class CifarResNet(nn.Module):
    def __init__(self, blocks_per_stage, num_classes=10, in_channels=3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        cin = 16
        for s in range(3):
            planes = 16 << s
            layers = []
            for b in range(blocks_per_stage):
                layers.append(BasicBlock(cin, planes, 2 if (b == 0 and s > 0) else 1))
                cin = planes
            setattr(self, "layer%d" % (s + 1), nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        # torchvision's initialisation, as mgtrain uses.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


CIFAR_DEPTHS = {"resnet20": 3, "resnet32": 5, "resnet44": 7, "resnet56": 9, "resnet110": 18}


def build(arch, num_classes, in_channels):
    """Returns the named network with num_classes outputs taking in_channels planes."""
    if arch in CIFAR_DEPTHS:
        return CifarResNet(CIFAR_DEPTHS[arch], num_classes, in_channels)
    import torchvision  # only torchvision's classifiers need it
    ctor = getattr(torchvision.models, arch, None)
    if ctor is None or not callable(ctor):
        raise SystemExit("unknown architecture %r" % arch)
    model = ctor(num_classes=num_classes)
    if in_channels != 3:
        if not arch.startswith("resnet"):
            raise SystemExit("%s: only the ResNets take --in-channels other than 3" % arch)
        model.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model


if __name__ == "__main__":
    import sys
    arch = sys.argv[1] if len(sys.argv) > 1 else "resnet20"
    classes = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    cin = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    m = build(arch, classes, cin)
    for name, t in m.state_dict().items():
        print("%-40s %s" % (name, list(t.shape)))
    print("parameters:", sum(p.numel() for p in m.parameters()))
