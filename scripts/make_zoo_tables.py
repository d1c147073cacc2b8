#!/usr/bin/python3
"""Writes tests/data/zoo/torchvision_archs.txt: for every torchvision 0.14 classifier mgtrain
builds (ARCHS), its parameter count, its convolution + linear multiply-accumulates per image
of the architecture's default side in evaluation (THOP's rule: out * cin/groups * r * s,
in * out; auxiliary heads run only in training), every state_dict entry in order with its
shape, at 1000 classes and torchvision's defaults (auxiliary heads included), and the crop and
resize of torchvision's weights' evaluation transforms (IMAGENET1K_V1's, or where there is none
the weights' with the smallest crop). tests/test_zoo.c holds every architecture mgtrain
registers (bar the CIFAR ResNets, which torchvision lacks) to it.

Usage: scripts/make_zoo_tables.py [ARCH ...] (default: all of ARCHS; named ones replace their
blocks in the existing file, or are added at its end, and the others stay as they are)"""
import os
import sys

import torch
import torchvision

ARCHS = [
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
    "resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d", "wide_resnet50_2",
    "wide_resnet101_2",
    "vgg11", "vgg13", "vgg16", "vgg19", "vgg11_bn", "vgg13_bn", "vgg16_bn", "vgg19_bn",
    "alexnet", "squeezenet1_0", "squeezenet1_1", "googlenet", "inception_v3",
    "densenet121", "densenet161", "densenet169", "densenet201",
    "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0",
    "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
    "mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3",
    "efficientnet_b0", "efficientnet_b1", "efficientnet_b2", "efficientnet_b3",
    "efficientnet_b4", "efficientnet_b5", "efficientnet_b6", "efficientnet_b7",
    "efficientnet_v2_s", "efficientnet_v2_m", "efficientnet_v2_l",
    "regnet_x_400mf", "regnet_x_800mf", "regnet_x_1_6gf", "regnet_x_3_2gf", "regnet_x_8gf",
    "regnet_x_16gf", "regnet_x_32gf",
    "regnet_y_400mf", "regnet_y_800mf", "regnet_y_1_6gf", "regnet_y_3_2gf", "regnet_y_8gf",
    "regnet_y_16gf", "regnet_y_32gf", "regnet_y_128gf",
    "convnext_tiny", "convnext_small", "convnext_base", "convnext_large",
    "vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14", "swin_t", "swin_s", "swin_b",
    "swin_v2_t", "swin_v2_s", "swin_v2_b",
]
# in a newer torchvision than Debian's 0.14 only (run this script with one for them)
NEWER = ["maxvit_t"]

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "zoo",
                   "torchvision_archs.txt")


def conv_fc_macs(model, size=224):
    total = [0]

    def hook(m, inp, out):
        if isinstance(m, torch.nn.Conv2d):
            total[0] += out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * \
                m.kernel_size[1]
        elif isinstance(m, torch.nn.Linear):
            total[0] += out.numel() * m.in_features

    hs = [m.register_forward_hook(hook) for m in model.modules()]
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, 3, size, size))
    for h in hs:
        h.remove()
    return total[0]


def eval_sizes(arch):
    """crop and resize of the weights' evaluation transforms (IMAGENET1K_V1, else the smallest
    crop)"""
    weights = list(torchvision.models.get_model_weights(arch))
    v1 = [w for w in weights if w.name == "IMAGENET1K_V1"]
    t = [w.transforms() for w in (v1 or weights)]
    t.sort(key=lambda t: t.crop_size[0])
    return t[0].crop_size[0], t[0].resize_size[0]


def main():
    torch.set_num_threads(2)
    torch.manual_seed(0)
    archs = sys.argv[1:] or [a for a in ARCHS + NEWER if a in torchvision.models.__dict__]
    lines = ["# torchvision %s state_dicts at 1000 classes, written by scripts/make_zoo_tables.py"
             % torchvision.__version__,
             "# arch NAME PARAMS CONV_FC_MACS_AT_CROP ENTRIES CROP RESIZE, then ENTRIES lines: "
             "NAME DIMxDIM (- for 0-d)"]
    if sys.argv[1:] and os.path.exists(OUT):  # keep the header and the others' blocks
        lines, keep = [], True
        for line in open(OUT).read().splitlines():
            if line.startswith("arch "):
                keep = line.split()[1] not in archs
            if keep:
                lines.append(line)
    for a in archs:
        model = torchvision.models.get_model(a, num_classes=1000) \
            if hasattr(torchvision.models, "get_model") else torchvision.models.__dict__[a](num_classes=1000)
        sd = model.state_dict()
        params = sum(p.numel() for p in model.parameters())
        crop, resize = eval_sizes(a)
        macs = conv_fc_macs(model, crop)
        # a block from another torchvision than the header's (maxvit_t: 0.15 and later) says so
        lines.append("arch %s %d %d %d %d %d%s" % (a, params, macs, len(sd), crop, resize,
                                                  "" if torchvision.__version__.startswith("0.14")
                                                  else " torchvision=" + torchvision.__version__))
        for k, v in sd.items():
            lines.append("%s %s" % (k, "x".join(str(d) for d in v.shape) if v.dim() else "-"))
        print("%-20s %12d params %14d MACs" % (a, params, macs), flush=True)
    with open(OUT + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(OUT + ".tmp", OUT)


if __name__ == "__main__":
    main()
