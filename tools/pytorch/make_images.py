# Writes a small synthetic ImageFolder tree of JPEGs (train/<class>/*.jpg) with PIL for the data-loading comparison in tools/compare-pytorch.sh.
"""Makes DIR/train/class_K/NNNNN.jpg: smooth colour gradients plus noise and a few shapes,
so that the JPEGs have realistic entropy (pure noise or flat colour would make decode
unrealistically slow or fast). Sizes vary around --size so crops and resizes do real work;
--width and --height give every image that size instead (500x375: ImageNet's typical photo).
Deterministic for a given --seed; skips work when the tree already has the requested count.
"""

import argparse
import os
import random


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--count", type=int, default=400)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--width", type=int, default=0, help="every image this wide (0: around --size)")
    p.add_argument("--height", type=int, default=0, help="every image this high (0: around --size)")
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    from PIL import Image, ImageDraw, ImageFilter
    import numpy as np

    root = os.path.join(a.dir, "train")
    have = sum(len(fs) for _, _, fs in os.walk(root)) if os.path.isdir(root) else 0
    marker = os.path.join(a.dir, ".made-%dx%d-q%d-s%d" % (a.width, a.height, a.quality, a.size))
    if have == a.count and (os.path.exists(marker) or not (a.width and a.height)):
        print("make_images.py: %s already has %d images" % (root, have))
        return
    rng = random.Random(a.seed)
    nrng = np.random.default_rng(a.seed)
    for i in range(a.count):
        cls = "class_%d" % (i % a.classes)
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        w = a.size + rng.randint(-a.size // 8, a.size // 4)
        h = a.size + rng.randint(-a.size // 8, a.size // 8)
        if a.width and a.height:
            w, h = a.width, a.height
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        base = np.stack([
            128 + 100 * np.sin(xx / rng.uniform(8, 60) + rng.uniform(0, 6)),
            128 + 100 * np.cos(yy / rng.uniform(8, 60) + rng.uniform(0, 6)),
            128 + 100 * np.sin((xx + yy) / rng.uniform(8, 60)),
        ], axis=2)
        base += nrng.normal(0, 12, base.shape)
        img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")
        d = ImageDraw.Draw(img)
        for _ in range(6):
            x0, y0 = rng.randint(0, w - 1), rng.randint(0, h - 1)
            x1, y1 = x0 + rng.randint(8, w // 2), y0 + rng.randint(8, h // 2)
            colour = tuple(rng.randint(0, 255) for _ in range(3))
            (d.ellipse if rng.random() < 0.5 else d.rectangle)([x0, y0, x1, y1], fill=colour)
        img = img.filter(ImageFilter.GaussianBlur(0.6))
        img.save(os.path.join(root, cls, "%05d.jpg" % i), quality=a.quality)
    open(marker, "w").close()
    print("make_images.py: wrote %d JPEGs under %s" % (a.count, root))


if __name__ == "__main__":
    main()
