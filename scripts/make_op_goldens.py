# Writes tests/data/ops/*.bin: PyTorch's answers for the reference kernels, for tests/test_ref.c.
#
# Run from anywhere with Debian's torch: /usr/bin/python3 scripts/make_op_goldens.py
# The output is deterministic (fixed seeds), so a rerun on the same torch rewrites the same bytes.
#
# File format (one file per case; read by tests/test_ref.c):
#   a text line   "mgt-golden 1 <number of arrays>\n"
#   then for each array:
#     a text line "<name> <f32|i32> <element count>\n"
#     the elements, raw little-endian float32 or int32, immediately after the newline.
# Integer parameters (shapes, strides) travel as i32 arrays and float parameters as f32 arrays,
# so each file says which op it was made for.
#
# Inputs are drawn in float64 and rounded to float32; the goldens are computed in float64 from
# those rounded inputs and rounded once at the end, so the only error left for the test's
# tolerance is the C code's own float rounding.
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goldens_common  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "ops")


def f32(t):
    """float64 tensor whose values are exactly representable in float32."""
    return t.to(torch.float32).to(torch.float64)


def write(name, arrays):
    return goldens_common.write(OUT, name, arrays)


def gemm():
    m, n, k, alpha, beta = 5, 7, 4, 1.5, 0.5
    arrays = [("dims", [m, n, k]), ("alpha_beta", [alpha, beta])]
    for ta in (0, 1):
        for tb in (0, 1):
            # a and b as stored: transposed ones are kept [k,m] and [n,k]
            a = f32(torch.randn(*((k, m) if ta else (m, k)), dtype=torch.float64))
            b = f32(torch.randn(*((n, k) if tb else (k, n)), dtype=torch.float64))
            c0 = f32(torch.randn(m, n, dtype=torch.float64))
            c = alpha * ((a.t() if ta else a) @ (b.t() if tb else b)) + beta * c0
            tag = ("t" if ta else "n") + ("t" if tb else "n")
            arrays += [(tag + ".a", a), (tag + ".b", b), (tag + ".c0", c0), (tag + ".c", c)]
    return write("gemm", arrays)


def conv(name, n, c, h, w, k, r, s, stride, pad, groups):
    x = f32(torch.randn(n, c, h, w, dtype=torch.float64)).requires_grad_()
    wt = f32(torch.randn(k, c // groups, r, s, dtype=torch.float64)).requires_grad_()
    y = F.conv2d(x, wt, stride=stride, padding=pad, groups=groups)
    dy = f32(torch.randn_like(y))
    y.backward(dy)
    shape = [n, c, h, w, k, r, s, stride[0], stride[1], pad[0], pad[1], groups]
    return write(name, [("shape", shape), ("x", x), ("w", wt), ("y", y), ("dy", dy),
                        ("dx", x.grad), ("dw", wt.grad)])


def batchnorm():
    n, c, h, w, eps, mom = 4, 3, 3, 5, 1e-5, 0.1
    # An offset mean and an uneven scale per channel, so a one-pass variance or a mix-up of
    # channels shows; channel 1's variance is small enough that a missing eps shows too (its
    # mean stays near 0: against a std of 0.01, the float rounding of a mean near 1 would
    # already move dx by 1e-4).
    x = torch.randn(n, c, h, w, dtype=torch.float64)
    x = f32(x * torch.tensor([2.0, 0.01, 1.0]).view(1, c, 1, 1)
            + torch.tensor([5.0, 0.02, -1.0]).view(1, c, 1, 1)).requires_grad_()
    gamma = f32(torch.rand(c, dtype=torch.float64) + 0.5).requires_grad_()
    beta = f32(torch.randn(c, dtype=torch.float64)).requires_grad_()
    rm0 = f32(torch.randn(c, dtype=torch.float64))
    rv0 = f32(torch.rand(c, dtype=torch.float64) + 0.5)
    rm1, rv1 = rm0.clone(), rv0.clone()
    y = F.batch_norm(x, rm1, rv1, gamma, beta, training=True, momentum=mom, eps=eps)
    xd = x.detach()
    mean = xd.mean(dim=(0, 2, 3))
    invstd = 1.0 / torch.sqrt(xd.var(dim=(0, 2, 3), unbiased=False) + eps)
    dy = f32(torch.randn_like(y))
    y.backward(dy)
    erm = f32(torch.randn(c, dtype=torch.float64))
    erv = f32(torch.rand(c, dtype=torch.float64) + 0.5)
    erv[1] = f32(torch.tensor(2e-4, dtype=torch.float64))  # where eps is 5% of the variance
    ey = F.batch_norm(xd, erm, erv, gamma.detach(), beta.detach(), training=False, eps=eps)
    return write("batchnorm", [
        ("shape", [n, c, h * w]), ("eps_momentum", [eps, mom]),
        ("x", x), ("gamma", gamma), ("beta", beta), ("running_mean0", rm0),
        ("running_var0", rv0), ("y", y), ("save_mean", mean), ("save_invstd", invstd),
        ("running_mean1", rm1), ("running_var1", rv1), ("dy", dy), ("dx", x.grad),
        ("dgamma", gamma.grad), ("dbeta", beta.grad), ("eval_running_mean", erm),
        ("eval_running_var", erv), ("eval_y", ey)])


def maxpool(name, n, c, h, w, kernel, stride, pad):
    # Half-integers give many ties, so the first-maximum rule matters; channel 0 is all
    # negative, so zero padding instead of -inf would win at the borders.
    x = torch.round(torch.randn(n, c, h, w, dtype=torch.float64) * 2) / 2
    x[:, 0] = -x[:, 0].abs() - 0.5
    x = x.requires_grad_()
    y = F.max_pool2d(x, kernel, stride=stride, padding=pad)
    dy = f32(torch.randn_like(y))
    y.backward(dy)
    shape = [n, c, h, w, kernel[0], kernel[1], stride[0], stride[1], pad[0], pad[1]]
    return write(name, [("shape", shape), ("x", x), ("y", y), ("dy", dy), ("dx", x.grad)])


def avgpool():
    n, c, h, w = 2, 5, 3, 3
    x = f32(torch.randn(n, c, h, w, dtype=torch.float64)).requires_grad_()
    y = F.adaptive_avg_pool2d(x, 1).flatten(1)
    dy = f32(torch.randn_like(y))
    y.backward(dy)
    return write("avgpool", [("shape", [n, c, h * w]), ("x", x), ("y", y), ("dy", dy),
                             ("dx", x.grad)])


def xent(name, n, classes, smoothing):
    logits = f32(torch.randn(n, classes, dtype=torch.float64) * 3).requires_grad_()
    labels = torch.randint(0, classes, (n,))
    loss = F.cross_entropy(logits, labels, label_smoothing=smoothing)
    loss.backward()
    probs = torch.softmax(logits.detach(), dim=1)
    return write(name, [("shape", [n, classes]), ("smoothing", [smoothing]),
                        ("logits", logits), ("labels", labels.tolist()), ("loss", [loss.item()]),
                        ("probs", probs), ("dlogits", logits.grad)])


def sgd(name, nesterov, dampening, grad_scale):
    n, steps, lr, mom, wd = 50, 3, 0.1, 0.9, 1e-4
    p = torch.nn.Parameter(f32(torch.randn(n, dtype=torch.float64)))
    opt = torch.optim.SGD([p], lr=lr, momentum=mom, dampening=dampening, weight_decay=wd,
                          nesterov=nesterov)
    arrays = [("shape", [n, steps]),
              ("lr_momentum_dampening_wd_scale_nesterov",
               [lr, mom, dampening, wd, grad_scale, 1.0 if nesterov else 0.0]),
              ("p0", p.detach().clone())]
    for t in range(1, steps + 1):
        g = f32(torch.randn(n, dtype=torch.float64))
        # mgtrain gets the unscaled gradient and grad_scale; torch gets the product.
        p.grad = g * grad_scale
        opt.step()
        arrays += [("g%d" % t, g), ("p%d" % t, p.detach().clone()),
                   ("buf%d" % t, opt.state[p]["momentum_buffer"].clone())]
    return write(name, arrays)


def casts():
    """torch's fp32 -> bf16 / fp16 casts (the codes as int32) of special values and values over
    many binades, and the decoding of random codes back to fp32, for lowp.h."""
    special = [0.0, -0.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 65504.0,
               65519.99, 65520.0, -1e6, 2**-24, 2**-25, 3 * 2**-26, 1.5 * 2**-15, float("inf"),
               float("-inf"), 3.4e38, -3.4028235e38, 1e-40, 2**-14, -2**-14 * (1 - 2**-10)]
    mant = torch.rand(2000, dtype=torch.float64) * 4 - 2
    expo = torch.randint(-30, 21, (2000,))
    x = torch.tensor(special + (mant * torch.pow(2.0, expo.double())).tolist()).to(torch.float32)
    bf = x.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    hf = x.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    codes = torch.randint(0, 65536, (3000,), dtype=torch.int32)
    c16 = codes.to(torch.int16)  # wraps: the bit patterns
    bf_back = c16.view(torch.bfloat16).to(torch.float32)
    hf_back = c16.view(torch.float16).to(torch.float32)
    return write("casts", [("x", x), ("bf16", bf), ("fp16", hf), ("codes", codes),
                           ("bf16_value", bf_back), ("fp16_value", hf_back)])


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(20240611)
    total = 0
    total += gemm()
    # stride 2, padding 1, odd sizes
    total += conv("conv_s2p1", 2, 3, 9, 7, 4, 3, 3, (2, 2), (1, 1), 1)
    # non-square filter, stride and padding; two groups
    total += conv("conv_rect_g2", 2, 4, 7, 10, 6, 3, 5, (1, 2), (1, 2), 2)
    # depthwise
    total += conv("conv_dw", 2, 4, 6, 5, 4, 3, 3, (1, 1), (1, 1), 4)
    # the 1x1 stride-2 shortcut of a ResNet
    total += conv("conv_1x1s2", 2, 4, 7, 7, 8, 1, 1, (2, 2), (0, 0), 1)
    total += batchnorm()
    total += maxpool("maxpool_k3s2p1", 2, 3, 9, 8, (3, 3), (2, 2), (1, 1))
    total += maxpool("maxpool_rect", 2, 2, 7, 9, (2, 3), (1, 2), (1, 1))
    total += avgpool()
    total += xent("xent_ls", 6, 10, 0.1)
    total += xent("xent_plain", 5, 7, 0.0)
    total += sgd("sgd_momentum", False, 0.0, 1.0)
    total += sgd("sgd_nesterov", True, 0.0, 1.0)
    total += sgd("sgd_dampening", False, 0.3, 0.5)
    total += casts()
    print("wrote %d bytes under %s" % (total, os.path.normpath(OUT)), file=sys.stderr)


if __name__ == "__main__":
    main()
