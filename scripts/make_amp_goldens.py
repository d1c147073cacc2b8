# Writes tests/data/models/*.amp_bf16.safetensors: PyTorch 1.13's CPU autocast (bf16) answers
# for one training forward and backward of the model goldens' cases (resnet20, resnet18, and
# mobilenet_v2 as make_mobile_goldens.py builds it), for tests/test_models.c.
#
# Run with Debian's torch: /usr/bin/python3 scripts/make_amp_goldens.py [TAG...]
# (after scripts/make_model_goldens.py and make_mobile_goldens.py, whose files give the weights,
# the input and labels). mobilenet_v2_3x64x64 needs a newer torch (made with PyTorch 2.15 from
# PyPI: /tmp/pt2/bin/python scripts/make_amp_goldens.py mobilenet_v2_3x64x64): 1.13's CPU
# autocast has no bf16 backward for ReLU6 (hardtanh).
#
# What autocast does on the CPU in 1.13: conv2d and linear run in bf16 (bf16 outputs), batch
# norm, ReLU, pooling and the residual adds then see bf16 tensors; the loss is computed here in
# fp32 from the logits cast back, with label smoothing 0.1; gradients land on the fp32
# parameters. mgtrain rounds only the inputs of convolutions and linear layers and keeps every
# result in fp32, so the two differ by bf16 noise of the same order as PyTorch's own distance
# from the exact answer. The files therefore also hold that exact answer (float64, the same
# weights and input): the C test takes |torch_bf16 - exact| as the noise level of each tensor
# and allows mgtrain's distance from torch_bf16 a small multiple of it.
#
# Per case: logits and loss (bf16 run and exact), and per parameter the L2 norm and 64 sampled
# elements (make_model_goldens.sample_index) of the gradient, both runs.
import os
import sys

import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goldens_common  # noqa: E402
import make_mobile_goldens as mm  # noqa: E402
import make_model_goldens as mg  # noqa: E402



def load_safetensors(path):
    return goldens_common.load_safetensors(path)[0]


def forward_backward(model, x, labels, amp):
    model.train()
    model.zero_grad()
    if amp:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        logits = logits.float()
    else:
        logits = model(x)
    loss = F.cross_entropy(logits, labels, label_smoothing=mg.SMOOTHING)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return logits.detach(), loss.detach().reshape(1), grads


def case(tag, arch, classes, cin, hashed, mobile=False):
    if mobile:  # torchvision's own model, make_mobile_goldens.py's weights and no dropout
        model = torchvision.models.__dict__[arch](num_classes=classes)
        mm.no_dropout(model)
    else:
        model = mg.build(arch, classes, cin)
    gold = load_safetensors(os.path.join(mg.OUT, tag + ".golden.safetensors"))
    if mobile:
        mm.mobile_hash_weights(model, arch)
    elif hashed:
        mg.hash_weights(model)
    else:
        model.load_state_dict(load_safetensors(os.path.join(mg.OUT, tag + ".weights.safetensors")))
    x, labels = gold["input"], gold["labels"].to(torch.int64)
    m64 = mg.copy.deepcopy(model).double()
    lb, sb, gb = forward_backward(model, x, labels, True)
    le, se, ge = forward_backward(m64, x.double(), labels, False)
    out = [("bf16.logits", mg.f32(lb)), ("bf16.loss", mg.f32(sb)),
           ("exact.logits", mg.f32(le)), ("exact.loss", mg.f32(se))]
    out += mg.summarise("bf16.grad.", {k: v.double() for k, v in gb.items()})
    out += mg.summarise("exact.grad.", ge)
    meta = {"arch": arch, "made_by": "scripts/make_amp_goldens.py, torch " + torch.__version__,
            "autocast": "cpu bfloat16"}
    n = mg.save_safetensors(os.path.join(mg.OUT, tag + ".amp_bf16.safetensors"), out, meta)
    d = float((lb.double() - le).abs().max() / le.abs().max())
    print("%s: %d bytes; bf16 logits within %.2g of the exact ones (relative to the largest)"
          % (tag, n, d))


CASES = [("resnet20_1x28x28", "resnet20", 10, 1, False, False),
         ("resnet18_3x64x64", "resnet18", 10, 3, True, False),
         ("mobilenet_v2_3x64x64", "mobilenet_v2", 10, 3, True, True)]


def main():
    torch.set_num_threads(2)
    want = sys.argv[1:]
    for tag, arch, classes, cin, hashed, mobile in CASES:
        if not want or tag in want:
            case(tag, arch, classes, cin, hashed, mobile)


if __name__ == "__main__":
    main()
