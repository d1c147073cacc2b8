# Writes tests/data/models/*.amp_bf16.safetensors: PyTorch 1.13's CPU autocast (bf16) answers
# for one training forward and backward of the model goldens' cases, for tests/test_models.c.
#
# Run with Debian's torch: /usr/bin/python3 scripts/make_amp_goldens.py
# (after scripts/make_model_goldens.py, whose files give the weights, the input and labels).
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goldens_common  # noqa: E402
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


def case(tag, arch, classes, cin, hashed):
    model = mg.build(arch, classes, cin)
    gold = load_safetensors(os.path.join(mg.OUT, tag + ".golden.safetensors"))
    if hashed:
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


def main():
    torch.set_num_threads(2)
    case("resnet20_1x28x28", "resnet20", 10, 1, False)
    case("resnet18_3x64x64", "resnet18", 10, 3, True)


if __name__ == "__main__":
    main()
