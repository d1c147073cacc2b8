#!/usr/bin/python3
"""Writes tests/data/recipe/decay_groups.txt: the weight decay torchvision's references give
each parameter (references/classification/utils.py's set_weight_decay, transcribed below: the
references are not part of the torchvision package) under --weight-decay 0.05
--norm-weight-decay 0.02 --bias-weight-decay 0.01 --transformer-embedding-decay 0, for
torchvision 0.14's models (every parameter in named_parameters order). test_train's
decay_groups holds mgtrain's grouping to it.

Usage: scripts/make_decay_goldens.py"""
import os

import torch
import torchvision

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "recipe",
                   "decay_groups.txt")
ARCHS = ["resnet18", "convnext_tiny", "vit_b_16", "swin_t", "swin_v2_t"]
WD, NORM, BIAS, EMBED = 0.05, 0.02, 0.01, 0.0


def set_weight_decay(model, weight_decay, norm_weight_decay=None, norm_classes=None,
                     custom_keys_weight_decay=None):
    # references/classification/utils.py, returning {parameter: decay} instead of groups
    if not norm_classes:
        norm_classes = [
            torch.nn.modules.batchnorm._BatchNorm,
            torch.nn.LayerNorm,
            torch.nn.GroupNorm,
            torch.nn.modules.instancenorm._InstanceNorm,
            torch.nn.LocalResponseNorm,
        ]
    norm_classes = tuple(norm_classes)
    params = {"other": [], "norm": []}
    params_weight_decay = {"other": weight_decay, "norm": norm_weight_decay}
    custom_keys = []
    if custom_keys_weight_decay is not None:
        for key, weight_decay in custom_keys_weight_decay:
            params[key] = []
            params_weight_decay[key] = weight_decay
            custom_keys.append(key)

    def _add_params(module, prefix=""):
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            is_custom_key = False
            for key in custom_keys:
                target_name = f"{prefix}.{name}" if prefix != "" and "." in key else name
                if key == target_name:
                    params[key].append(p)
                    is_custom_key = True
                    break
            if not is_custom_key:
                if norm_weight_decay is not None and isinstance(module, norm_classes):
                    params["norm"].append(p)
                else:
                    params["other"].append(p)
        for child_name, child_module in module.named_children():
            child_prefix = f"{prefix}.{child_name}" if prefix != "" else child_name
            _add_params(child_module, prefix=child_prefix)

    _add_params(model)
    decay = {}
    for key in params:
        for p in params[key]:
            decay[id(p)] = params_weight_decay[key]
    return decay


def main():
    keys = [("bias", BIAS)] + [(k, EMBED) for k in
                               ["class_token", "position_embedding", "relative_position_bias_table"]]
    lines = ["# set_weight_decay of torchvision %s's models: wd %g, norm %g, bias %g, embedding %g"
             % (torchvision.__version__, WD, NORM, BIAS, EMBED),
             "# arch NAME COUNT, then COUNT lines: PARAMETER DECAY"]
    for a in ARCHS:
        model = torchvision.models.__dict__[a](num_classes=10)
        decay = set_weight_decay(model, WD, NORM, custom_keys_weight_decay=keys)
        named = list(model.named_parameters())
        lines.append("arch %s %d" % (a, len(named)))
        lines += ["%s %g" % (n, decay[id(p)]) for n, p in named]
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("%s: %d lines" % (OUT, len(lines)))


if __name__ == "__main__":
    main()
