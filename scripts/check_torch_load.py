# Loads a state_dict that mgtrain wrote into PyTorch's model with strict=True and checks that
# PyTorch computes what mgtrain computed: called by tests/test_models.c (test_torch_load).
#
# usage: /usr/bin/python3 scripts/check_torch_load.py WEIGHTS.safetensors CHECK.safetensors
#   WEIGHTS: mgtrain's mgt_model_save_safetensors output (metadata arch, classes, in_channels,
#            image_size).
#   CHECK:   mgtrain's answers for that state: input, labels (I32), eval_logits, train_logits,
#            loss (label smoothing in the metadata), and for every parameter grad.<name>.norm
#            and grad.<name>.samples (the elements make_model_goldens.sample_index picks), and
#            for every BN buffer after the training forward stats.<name>.samples.
# Uses torchvision's model where python3-torchvision is installed, else the classes
# written out in make_model_goldens.py. Exit status 0: all agree; 1: a mismatch (printed);
# 77: PyTorch is missing (the C test skips). MGT_CHECK_GRADS=0 leaves the gradients out.
import copy
import math
import os
import sys

# sleeping OpenMP workers beside other tests (check_zoo_strict.py says why); before torch
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("check_torch_load: PyTorch is not installed")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_goldens as mg  # noqa: E402
from goldens_common import fast_double_depthwise, load_safetensors  # noqa: E402

TOL_FWD, TOL_GRAD = 2e-5, 5e-4
# a gradient tolerance never below OWN times PyTorch's own float32 error (see main)
OWN = 3


def with_metadata(model, sd):
    """sd as an OrderedDict carrying model's own state_dict versions (torch.save keeps them in
    _metadata; a safetensors file has none, and MNASNet refuses a state_dict without its
    version 2)"""
    from collections import OrderedDict
    out = OrderedDict(sd)
    out._metadata = model.state_dict()._metadata
    return out


def build(arch, classes, cin):
    try:
        import torchvision
    except ImportError:
        return mg.build(arch, classes, cin), "make_model_goldens.py's torchvision classes"
    if arch not in torchvision.models.__dict__:
        return mg.build(arch, classes, cin), "make_model_goldens.py's CIFAR classes"
    model = torchvision.models.__dict__[arch](num_classes=classes)
    if cin != 3:
        model.conv1 = torch.nn.Conv2d(cin, 64, 7, 2, 3, bias=False)
    return model, "torchvision " + torchvision.__version__


def check_gradients(loss, params, model32, arch, x, labels, smoothing, check, rel):
    """Every parameter's gradient samples and norm against the check file's."""
    import make_zoo_goldens as zg
    loss.backward()
    # gradients are judged against their layer's scale: a BN bias gradient can be a sum that
    # cancels to nothing (exactly 0 where the next BN removes a per-channel shift), which
    # leaves only rounding noise to compare
    layer_scale, layer_norm = {}, {}
    for name, p in params.items():
        idx = mg.sample_index(name, p.numel())
        layer = name.rsplit(".", 1)[0]
        layer_scale[layer] = max(layer_scale.get(layer, 0.0),
                                 float(p.grad.reshape(-1)[idx].abs().max()))
        layer_norm[layer] = max(layer_norm.get(layer, 0.0), float(p.grad.norm()))
    # A gradient that float32 itself cannot hold to TOL_GRAD (a stride-2 projection into a
    # 2x2 stage, whose BN sees few values per channel) gets OWN times PyTorch's own float32
    # error on the same weights and input as its tolerance: rounding noise widens it, a wrong
    # gradient (off by its own size) does not pass
    own = {}
    model32.train()
    zg.train_loss(model32, arch, x.float(), labels, smoothing)[1].backward()
    for name, p in model32.named_parameters():
        g64 = params[name].grad.reshape(-1)
        idx = mg.sample_index(name, p.numel())
        layer = name.rsplit(".", 1)[0]
        e = float((p.grad.reshape(-1)[idx].double() - g64[idx]).abs().max())
        own[name] = e / max(layer_scale[layer], 1e-30)
    widened = 0
    for name, p in params.items():
        g = p.grad.reshape(-1)
        idx = mg.sample_index(name, p.numel())
        tol = max(TOL_GRAD, OWN * own[name])
        widened += tol > TOL_GRAD
        rel("grad." + name + ".samples", check["grad." + name + ".samples"], g[idx],
            scale=layer_scale[name.rsplit(".", 1)[0]], tol=tol)
        rel("grad." + name + ".norm", check["grad." + name + ".norm"], g.norm().reshape(1),
            scale=layer_norm[name.rsplit(".", 1)[0]], tol=tol)
    if widened:
        print("check_torch_load: %d gradient tolerances widened to %d times PyTorch's own float32 "
              "error" % (widened, OWN))


def main():
    weights, meta = load_safetensors(sys.argv[1])
    check, cmeta = load_safetensors(sys.argv[2])
    arch, classes = meta["arch"], int(meta["classes"])
    model, source = build(arch, classes, int(meta["in_channels"]))
    model.load_state_dict(with_metadata(model, weights), strict=True)
    # dropout and stochastic depth at p = 0, as the C side builds them (no_dropout)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
    check_grads = os.environ.get("MGT_CHECK_GRADS", "1") != "0"
    # PyTorch's own float32 error, the widening of a gradient's tolerance (below)
    model32 = copy.deepcopy(model).float() if check_grads else None
    model = fast_double_depthwise(model.double())
    print("check_torch_load: %s from %s, loaded with strict=True" % (arch, source))
    x = check["input"].double()
    labels = check["labels"].long()
    worst = []

    def rel(name, got, want, scale=None, tol=TOL_FWD):
        got, want = got.double().reshape(-1), want.double().reshape(-1)
        s = float(want.abs().max()) if scale is None else scale
        e = float((got - want).abs().max()) / max(s, 1e-30)
        worst.append((e / tol, name, e, tol, float(got.abs().max()), float(want.abs().max())))

    model.eval()
    with torch.no_grad():
        rel("eval_logits", model(x), check["eval_logits"])
    model.train()
    # the loss mgtrain trains: with the auxiliary classifiers' losses where the model has them
    import make_zoo_goldens as zg
    smoothing = float(cmeta["smoothing"])
    logits, loss, _ = zg.train_loss(model, arch, x, labels, smoothing)
    rel("train_logits", logits.detach(), check["train_logits"])
    rel("loss", loss.detach(), check["loss"])
    sd = model.state_dict()
    params = dict(model.named_parameters())
    # MGT_CHECK_GRADS=0: the state_dict, logits, loss and BN statistics only (for weights whose
    # gradients are too ill-conditioned in float32 to hold to TOL_GRAD); no backward then
    if check_grads:
        check_gradients(loss, params, model32, arch, x, labels, smoothing, check, rel)
    for name, t in sd.items():
        if name.endswith("running_mean") or name.endswith("running_var"):
            idx = mg.sample_index(name, t.numel())
            rel("stats." + name, check["stats." + name + ".samples"], t.reshape(-1)[idx])
    worst.sort(reverse=True)
    for ratio, name, e, tol, g, w in worst[:int(os.environ.get("MGT_CHECK_SHOW", "5"))]:
        print("  %-50s rel %.3g (tolerance %.2g; max |mgtrain| %.3g, |PyTorch| %.3g)"
              % (name, e, tol, g, w))
    if worst[0][0] > 1:
        print("check_torch_load: MISMATCH at %s" % worst[0][1])
        return 1
    print("check_torch_load: %d tensors agree" % len(worst))
    return 0


if __name__ == "__main__":
    sys.exit(main())
