# Writes tests/data/models/*: PyTorch's answers for whole ResNets, for tests/test_models.c.
#
# Run from anywhere with Debian's torch: /usr/bin/python3 scripts/make_model_goldens.py
# python3-torchvision is not always installed, so the ResNet classes below are written out as
# torchvision 0.14 defines them (BasicBlock, Bottleneck with the stride on the 3x3 conv,
# downsample = 1x1 conv + BN, zero_init_residual) plus the CIFAR ResNets of He et al. 2016 with
# 1x1 conv + BN projections where the shape changes (option B). Where torchvision is present,
# main() checks that its resnet18/50 have the same state_dict and outputs as these. State-dict
# names are torchvision's, so the files load with strict=True into torchvision's own models.
#
# The output is deterministic (fixed seeds). PyTorch computes in float64 from the float32
# weights and input, and every answer is rounded to float32 once, so what is left for the C
# test's tolerance is the C code's own float32 rounding.
#
# Cases (all train on the same batch twice with SGD lr 0.1, momentum 0.9, weight decay 5e-4,
# label smoothing 0.1):
#   resnet20_1x28x28: resnet20, 10 classes, batch 8. Two files:
#     resnet20_1x28x28.weights.safetensors  the initial state_dict (F32, num_batches_tracked I64)
#     resnet20_1x28x28.golden.safetensors   input, labels, eval logits, per step logits and
#         loss, step-1 gradients (grad.<name>), running stats after each step
#         (step1.<name>, step2.<name>), parameters after step 2 (step2.<name>).
#   resnet18_3x64x64: resnet18, 10 classes, batch 2, weights from a formula (see hash_weights)
#     that the C test recomputes, so the 45 MB of weights and gradients need not be committed;
#     the golden keeps full logits and losses and, per tensor, its L2 norm and 64 sampled
#     elements of the step-1 gradient and of the parameters after step 2.
import copy
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "models")

LR, MOMENTUM, WD, SMOOTHING = 0.1, 0.9, 5e-4, 0.1


# ---- models, as torchvision writes them ----

def conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def conv1x1(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * 4)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision.models.ResNet; cifar=True gives He et al.'s 3-stage CIFAR network."""

    def __init__(self, block, layers, num_classes=1000, in_channels=3, cifar=False,
                 zero_init_residual=False):
        super().__init__()
        self.cifar = cifar
        widths = (16, 32, 64) if cifar else (64, 128, 256, 512)
        self.inplanes = widths[0]
        if cifar:
            self.conv1 = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        else:
            self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = None if cifar else nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        for i, (w, n) in enumerate(zip(widths, layers)):
            setattr(self, "layer%d" % (i + 1), self._make_layer(block, w, n, 1 if i == 0 else 2))
        self.nstages = len(widths)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[-1] * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.constant_(m.bn3.weight, 0)
                elif isinstance(m, BasicBlock):
                    nn.init.constant_(m.bn2.weight, 0)

    def _make_layer(self, block, planes, blocks, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        if self.maxpool is not None:
            x = self.maxpool(x)
        for i in range(self.nstages):
            x = getattr(self, "layer%d" % (i + 1))(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


ARCHS = {
    "resnet18": (BasicBlock, [2, 2, 2, 2], False),
    "resnet34": (BasicBlock, [3, 4, 6, 3], False),
    "resnet50": (Bottleneck, [3, 4, 6, 3], False),
    "resnet101": (Bottleneck, [3, 4, 23, 3], False),
    "resnet152": (Bottleneck, [3, 8, 36, 3], False),
    "resnet20": (BasicBlock, [3, 3, 3], True),
    "resnet32": (BasicBlock, [5, 5, 5], True),
    "resnet44": (BasicBlock, [7, 7, 7], True),
    "resnet56": (BasicBlock, [9, 9, 9], True),
    "resnet110": (BasicBlock, [18, 18, 18], True),
}


def build(arch, classes, in_channels):
    block, layers, cifar = ARCHS[arch]
    return ResNet(block, layers, classes, in_channels, cifar)


# ---- multiply-accumulate counts, by THOP's rules ----

def count_macs(model, shape):
    """THOP's count: conv out*(cin/groups*r*s), linear in*out, batch norm 2 per element,
    adaptive avgpool (hw + 1) per output, relu and max pool 0. Returns (total, conv+linear)."""
    total = [0, 0]

    def hook(m, inp, out):
        if isinstance(m, nn.Conv2d):
            v = out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
            total[1] += v
        elif isinstance(m, nn.Linear):
            v = out.numel() * m.in_features
            total[1] += v
        elif isinstance(m, nn.BatchNorm2d):
            v = 2 * inp[0].numel()
        elif isinstance(m, nn.AdaptiveAvgPool2d):
            v = out.numel() * (inp[0].shape[2] * inp[0].shape[3] + 1)
        else:
            return
        total[0] += v

    hs = [m.register_forward_hook(hook) for m in model.modules()]
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, *shape))
    for h in hs:
        h.remove()
    return total[0], total[1]


# ---- safetensors, written by hand (no safetensors package in Debian) ----

DTYPES = {torch.float32: "F32", torch.int64: "I64", torch.int32: "I32"}


def save_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors:
        t = t.detach().contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for b in blobs:
            f.write(b)
    return os.path.getsize(path)


def f32(t):
    return t.detach().to(torch.float32)


# ---- formula weights (resnet18 case), recomputed bit for bit by tests/test_models.c ----

M32 = 0xFFFFFFFF


def fnv1a(name):
    h = 0x811C9DC5
    for c in name.encode():
        h = ((h ^ c) * 0x01000193) & M32
    return h


def fmix32(x):
    """murmur3's finaliser over an int64 tensor of 32-bit values (products wrap in int64, and
    only their low 32 bits are kept, as in C's uint32_t arithmetic)."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & M32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & M32
    return x ^ (x >> 16)


def hash_uniform(name, n):
    """n values in [0, 1): fmix32(i * 0x9E3779B1 + fnv1a(name)) >> 8, divided by 2^24."""
    i = torch.arange(n, dtype=torch.int64)
    x = fmix32((i * 0x9E3779B1 + fnv1a(name)) & M32)
    return (x >> 8).to(torch.float64) / 16777216.0


def is_final_bn(name):
    """The BN whose output meets the identity (bn2 of a BasicBlock) or the projection BN."""
    return ".downsample.1." in name or (name.startswith("layer") and ".bn2." in name)


def hash_weights(model):
    """Every tensor v = (u - 0.5) * scale + shift, computed in float64, rounded to float32:
    convs scale sqrt(12) * sqrt(2 / fan_out) (kaiming's std), fc.weight and fc.bias scale
    2 / sqrt(fan_in), running_mean 0.2 (u - .5), running_var 1 + 0.5 (u - .5),
    num_batches_tracked 0; BN weight and bias as separated_bn says: weight 0.3 + 0.2 (u - .5),
    bias 2.5 + (u - .5), negated where u < 0.25 unless the BN is a block's last or a
    projection. For BasicBlock networks (resnet18/34) only."""
    sd = model.state_dict()
    fc_in = sd["fc.weight"].shape[1]
    for name, t in sd.items():
        if name.endswith("num_batches_tracked"):
            t.zero_()
            continue
        u = hash_uniform(name, t.numel())
        if name.endswith("running_var"):
            scale, shift = 0.5, 1.0
        elif name.endswith("running_mean"):
            scale, shift = 0.2, 0.0
        elif name.startswith("fc."):
            scale, shift = 2.0 / math.sqrt(fc_in), 0.0
        elif t.dim() == 4:
            fan_out = t.shape[0] * t.shape[2] * t.shape[3]
            scale, shift = math.sqrt(12.0) * math.sqrt(2.0 / fan_out), 0.0
        elif name.endswith(".weight"):
            scale, shift = 0.2, 0.3
        else:
            scale, shift = 1.0, 2.5
        v = (u - 0.5) * scale + shift
        if name.endswith(".bias") and not name.startswith("fc.") and not is_final_bn(name):
            v = torch.where(u < 0.25, -v, v)
        t.copy_(v.to(torch.float32).reshape(t.shape))


# ---- the two steps ----

class NearTie(Exception):
    """float32 and float64 could route a gradient differently (see relu_margin)."""


def run_steps(model32, x32, labels, steps=2):
    """Trains a float64 copy of model32 on (x, labels) `steps` times; returns what each step
    saw and the state after it."""
    model = copy.deepcopy(model32).double()
    x = x32.double()
    out = {}
    model.eval()
    with torch.no_grad():
        out["eval_logits"] = f32(model(x))
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    for step in range(1, steps + 1):
        relu, pool = relu_margin(copy.deepcopy(model), x)
        print("  step %d: smallest |pre-ReLU| %.3g, smallest max-pool gap %.3g"
              % (step, relu, pool))
        if relu < 1e-2 or pool < 2e-5:
            raise NearTie("step %d: |pre-ReLU| %.3g or max-pool gap %.3g too small"
                          % (step, relu, pool))
        model.train()
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits, labels, label_smoothing=SMOOTHING)
        loss.backward()
        out["step%d.logits" % step] = f32(logits)
        out["step%d.loss" % step] = f32(loss.reshape(1))
        if step == 1:
            out["grads"] = {n: f32(p.grad) for n, p in model.named_parameters()}
        opt.step()
        out["step%d.state" % step] = {
            n: (t.detach().clone() if t.dtype == torch.int64 else f32(t))
            for n, t in model.state_dict().items()}
    return out


def separated_bn(model, gen):
    """BN parameters that keep every value entering a ReLU at least ~0.5 away from zero.

    PyTorch here computes in float64 and the C code in float32; where a pre-ReLU value lies
    within that rounding of zero, the two ReLU masks differ, and one flipped element moves a
    whole weight gradient by percents (it is a full-size gradient contribution among a few
    hundred that mostly cancel), which no honest tolerance can absorb. So: weights
    gamma in [0.2, 0.4]; a BN followed by its own ReLU gets |beta| in [2, 3], negative for
    about a quarter of the channels (dead channels: their masks are tested too); a BN whose
    output meets the identity (bn2, downsample.1) gets beta in [2, 3], so relu(bn + identity)
    with identity >= 0 or a projection's positive output stays positive. Batch statistics
    make |x_hat| < 5 here, so gamma * x_hat never reaches beta.
    torchvision's init would leave BN at weight 1, bias 0, mean 0, var 1, which would also
    hide a swapped gamma/beta or a BN that ignores its running stats in eval mode; the running
    stats are random for the same reason."""
    for name, m in model.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            final = is_final_bn(name + ".")
            with torch.no_grad():
                m.weight.copy_(0.2 + 0.2 * torch.rand(c, generator=gen))
                beta = 2 + torch.rand(c, generator=gen)
                if not final:
                    beta = torch.where(torch.rand(c, generator=gen) < 0.25, -beta, beta)
                m.bias.copy_(beta)
                m.running_mean.copy_(0.2 * torch.randn(c, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(c, generator=gen))
                m.num_batches_tracked.fill_(3)


def relu_margin(model, x):
    """The smallest |value| entering any ReLU in a training forward, and the smallest gap
    between the two largest values of a max-pool window whose maximum is positive (a near tie
    could route the gradient differently); the script refuses goldens where either is tiny."""
    found = {"relu": math.inf, "pool": math.inf}

    def relu_hook(m, inp):
        found["relu"] = min(found["relu"], float(inp[0].abs().min()))

    def pool_hook(m, inp):
        v = F.pad(inp[0], (1, 1, 1, 1), value=-math.inf)
        w = v.unfold(2, 3, 2).unfold(3, 3, 2).reshape(*v.shape[:2], -1, 9)
        top = w.topk(2, dim=-1).values
        live = top[..., 0] > 0
        if live.any():
            found["pool"] = min(found["pool"], float((top[..., 0] - top[..., 1])[live].min()))

    hs = [m.register_forward_pre_hook(relu_hook) for m in model.modules()
          if isinstance(m, nn.ReLU)]
    hs += [m.register_forward_pre_hook(pool_hook) for m in model.modules()
           if isinstance(m, nn.MaxPool2d)]
    model = model.train()
    with torch.no_grad():
        model(x)
    for h in hs:
        h.remove()
    return found["relu"], found["pool"]


def meta(arch, classes, in_channels, size, batch):
    return {"arch": arch, "classes": str(classes), "in_channels": str(in_channels),
            "size": str(size), "batch": str(batch), "lr": repr(LR), "momentum": repr(MOMENTUM),
            "weight_decay": repr(WD), "smoothing": repr(SMOOTHING),
            "made_by": "scripts/make_model_goldens.py, torch " + torch.__version__}


def case_resnet20():
    arch, classes, cin, size, batch = "resnet20", 10, 1, 28, 8
    torch.manual_seed(20)
    model = build(arch, classes, cin)
    gen = torch.Generator().manual_seed(2020)
    separated_bn(model, gen)
    x = torch.randn(batch, cin, size, size, generator=gen)
    labels = torch.randint(0, classes, (batch,), generator=gen)
    try:
        res = run_steps(model, x, labels)
    except NearTie as e:
        raise SystemExit("resnet20: %s" % e)
    tag = "%s_%dx%dx%d" % (arch, cin, size, size)
    m = meta(arch, classes, cin, size, batch)
    sd = model.state_dict()
    n = save_safetensors(os.path.join(OUT, tag + ".weights.safetensors"), list(sd.items()), m)
    g = [("input", x), ("labels", labels.to(torch.int32)), ("eval_logits", res["eval_logits"])]
    for step in (1, 2):
        g += [("step%d.logits" % step, res["step%d.logits" % step]),
              ("step%d.loss" % step, res["step%d.loss" % step])]
    g += [("grad." + k, v) for k, v in res["grads"].items()]
    params = dict(model.named_parameters())
    for step in (1, 2):
        for k, v in res["step%d.state" % step].items():
            # parameters after step 1 follow from the weights and grads; keep only step 2's
            if k in params and step == 1:
                continue
            g.append(("step%d.%s" % (step, k), v))
    n += save_safetensors(os.path.join(OUT, tag + ".golden.safetensors"), g, m)
    return tag, n


SAMPLES = 64


def sample_index(name, numel):
    """SAMPLES element positions of a tensor (all of them when it is smaller)."""
    if numel <= SAMPLES:
        return torch.arange(numel)
    u = hash_uniform("sample:" + name, SAMPLES)
    return (u * numel).to(torch.int64).clamp_(max=numel - 1)


def summarise(prefix, tensors):
    out = []
    for k, v in tensors.items():
        flat = v.reshape(-1)
        if flat.dtype == torch.int64:
            out.append((prefix + k, flat.clone().reshape(v.shape)))
            continue
        idx = sample_index(k, flat.numel())
        out.append((prefix + k + ".norm", f32(flat.double().norm().reshape(1))))
        out.append((prefix + k + ".samples", f32(flat[idx])))
    return out


def case_resnet18():
    arch, classes, cin, size, batch = "resnet18", 10, 3, 64, 2
    model = build(arch, classes, cin)
    hash_weights(model)
    # 32k max-pool windows: a near tie (gap < 2e-5) is likely enough that the input seed is
    # searched for one without any, in order, so the result is still deterministic.
    for seed in range(1818, 1868):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, cin, size, size, generator=gen)
        labels = torch.randint(0, classes, (batch,), generator=gen)
        try:
            res = run_steps(model, x, labels)
            break
        except NearTie as e:
            print("  input seed %d: %s" % (seed, e))
    else:
        raise SystemExit("resnet18: no input seed without near ties")
    tag = "%s_%dx%dx%d" % (arch, cin, size, size)
    m = meta(arch, classes, cin, size, batch)
    m["weights"] = "hash formula (scripts/make_model_goldens.py hash_weights)"
    m["weights_sum"] = repr(sum(float(v.double().sum()) for v in model.state_dict().values()))
    g = [("input", x), ("labels", labels.to(torch.int32)), ("eval_logits", res["eval_logits"])]
    for step in (1, 2):
        g += [("step%d.logits" % step, res["step%d.logits" % step]),
              ("step%d.loss" % step, res["step%d.loss" % step])]
    g += summarise("grad.", res["grads"])
    g += summarise("step2.", res["step2.state"])
    n = save_safetensors(os.path.join(OUT, tag + ".golden.safetensors"), g, m)
    return tag, n


def print_counts():
    for arch, classes, cin, size in (("resnet18", 1000, 3, 224), ("resnet50", 1000, 3, 224),
                                     ("resnet20", 10, 1, 28)):
        model = build(arch, classes, cin)
        params = sum(p.numel() for p in model.parameters())
        total, convfc = count_macs(model, (cin, size, size))
        print("%-9s %dx%dx%d %4d classes: %d parameters, %d MACs (%d in convs and fc)"
              % (arch, cin, size, size, classes, params, total, convfc))


def check_against_torchvision():
    try:
        import torchvision
    except ImportError:
        print("torchvision not installed: the classes here are not compared with it")
        return
    for arch in ("resnet18", "resnet50"):
        tv, ours = torchvision.models.__dict__[arch](num_classes=10), build(arch, 10, 3)
        a, b = tv.state_dict(), ours.state_dict()
        assert [(k, v.shape) for k, v in a.items()] == [(k, v.shape) for k, v in b.items()], arch
        ours.load_state_dict(a)
        x = torch.randn(2, 3, 64, 64)
        with torch.no_grad():
            assert torch.equal(tv.eval()(x), ours.eval()(x)), arch
    print("torchvision %s: resnet18 and resnet50 match the classes here" % torchvision.__version__)


def main():
    torch.set_num_threads(2)
    check_against_torchvision()
    os.makedirs(OUT, exist_ok=True)
    for fn in (case_resnet20, case_resnet18):
        tag, n = fn()
        print("%s: %d bytes" % (tag, n))
    print_counts()


if __name__ == "__main__":
    main()
