#!/usr/bin/python3
"""How far PyTorch's own float32 gradients are from its float64 ones with make_zoo_goldens.py's
weights and input (the tolerance test_zoo holds mgtrain to: 5e-4 of the layer's largest): where
most tensors miss it, a golden's gradients measure conditioning, not the implementation.

Usage: scripts/check_zoo_float32.py ARCH SIZE"""
import os, sys, torch, torchvision, torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_zoo_goldens as z
torch.set_num_threads(2)
arch, size = sys.argv[1], int(sys.argv[2])
def run(dt):
    model = z.build(arch)
    gen = torch.Generator().manual_seed(1212)
    x = torch.randn(z.BATCH, 3, size, size, generator=gen)
    labels = torch.randint(0, z.CLASSES, (z.BATCH,), generator=gen)
    m = model.to(dt); m.train()
    loss = z.train_loss(m, arch, x.to(dt), labels)[1]
    loss.backward()
    return {n: p.grad.double() for n, p in m.named_parameters()}
g64, g32 = run(torch.float64), run(torch.float32)
# per layer scale: the largest |grad| over the layer's params
layers = {}
for n, g in g64.items():
    l = n.rsplit(".", 1)[0]; layers[l] = max(layers.get(l, 0), float(g.abs().max()))
bad = 0
for n in g64:
    l = n.rsplit(".", 1)[0]
    err = float((g32[n] - g64[n]).abs().max()) / layers[l]
    if err > 5e-4:
        bad += 1
        if bad < 8: print(n, "rel err", err)
print("float32 PyTorch: %d of %d gradients beyond 5e-4 of their layer's largest" % (bad, len(g64)))
