#!/usr/bin/python3
"""Writes the data pipeline's golden files in tests/data/pipeline/ for tests/test_data.c.

Run with Debian's python3 (numpy, and python3-pil for the resize and gray goldens):
    /usr/bin/python3 scripts/make_data_goldens.py

What each file checks, and against what:
- resize.txt: crop + bilinear resize of small random 8-bit images, computed by PIL
  (Image.crop(box).resize(size, Image.BILINEAR), exactly what torchvision's resized_crop and
  Resize do to a PIL image). mgtrain resamples in float, PIL in 8 bits with a rounding
  between its two passes, so the test allows about one level of difference.
- resize_interp.txt: the same with Image.NEAREST and Image.BICUBIC (--interpolation): nearest
  must match exactly, bicubic within PIL's rounding between the passes.
- gray.txt: RGB pixels and PIL's convert("L") of them (mgtrain must match exactly).
- *.jpg and jpeg.txt: JPEG files written by libjpeg through PIL (baseline 4:4:4 and 4:2:0,
  progressive, gray, Adobe CMYK) and PIL's decoding of each, for stb_image's decoding (the
  tests also cut them to make truncated files; stb_image_write's JPEG encoder is not used
  because it shifts signed ints past their range, which UBSan stops on).
- rrc.txt: torchvision's RandomResizedCrop.get_params, replayed: each case lists the random
  draws (uniform values with their bounds, randint results with their ranges) and the crop
  they lead to. With torch and torchvision importable, the draws come from torch's own
  generator and the crop from torchvision itself; otherwise (as on Debian 12 without
  python3-torchvision) from random.Random and a transcription of torchvision's published
  get_params (v0.14, torchvision/transforms/transforms.py), which the header line says.
- augment_ops.txt.gz: torchvision 0.14's autoaugment._apply_op (the ops of TrivialAugmentWide,
  RandAugment and AutoAugment) on fixed 8-bit PIL images, each op at fixed magnitudes and,
  for the geometric ones, with nearest, bilinear and bicubic interpolation: the output
  pixels (mgtrain must match exactly: the ops are PIL's arithmetic).
- augment_space.txt: the magnitude tables of the policies' _augmentation_space (AugMix's
  too) and AutoAugmentPolicy's IMAGENET, CIFAR10 and SVHN sub-policies, from torchvision
  itself.
- augmix_ops.txt.gz: the same _apply_op on uint8 tensors (CHW), as AugMix calls it: tensor
  arithmetic (affine transforms through grid_sample, bilinear; the enhancers as _blend in
  float32, truncated), each op at fixed magnitudes, on the same images (exact).
- augmix.txt.gz: AugMix(severity) itself on uint8 tensors, its random draws recorded (the
  Dirichlet weights, each chain's depth, ops, magnitude bins and signs) beside the output,
  so that mgtrain replays the draws and must give the same pixels.
- erase.txt: RandomErasing.get_params replayed like rrc.txt (draws from torch's generator,
  the rectangle from torchvision).
- mix.txt: mixup and cutmix as torchvision's references recipe does them
  (references/classification/transforms.py, RandomMixup and RandomCutmix, v0.14; not part
  of the python3-torchvision package, so transcribed below with their random draws passed
  in): a batch of three float images, its mixed images and soft targets for given lambdas and
  boxes; and torch's CrossEntropyLoss(label_smoothing) with such soft targets, its mean and
  its gradient for the logits (the mixed-label softmax cross-entropy op must match both).
- ra_sampler.txt: torchvision's references' RASampler (a transcription) with shuffle=False
  for several (n, replicas, reps, rank): `make_data_goldens.py ra_sampler` writes it alone.
- sampler.txt: torch.utils.data.DistributedSampler with shuffle=False for several (n,
  replicas, drop_last): the padding and striding act on the permutation, so on the identity
  they show every index each rank gets. From torch itself when importable, else from a
  transcription of DistributedSampler.__iter__ (torch 1.13, torch/utils/data/distributed.py).
"""
import contextlib
import gzip
import math
import os
import random
import struct
import sys

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "pipeline")

try:
    import torch
    import torchvision
    from torchvision import transforms as T

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

try:
    from PIL import Image

    HAVE_PIL = True
except ImportError:
    HAVE_PIL = False


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


@contextlib.contextmanager
def gz_lines(path):
    """A gzip text file written a line at a time (mtime 0: a rerun writes the same bytes);
    yields line(text)."""
    with gzip.GzipFile(path, "wb", mtime=0) as gz:
        yield lambda t: gz.write((t + "\n").encode())


# ---------------------------------------------------------------- RandomResizedCrop


class Recorder:
    """Random draws as torchvision's get_params makes them, from Python's random module,
    rounded as torch's float32 tensors round them."""

    def __init__(self, seed):
        self.r = random.Random(seed)
        self.draws = []

    def uniform(self, lo, hi):
        lo32, hi32 = f32(lo), f32(hi)
        u = self.r.getrandbits(24) / float(1 << 24)
        v = f32(f32(u * f32(hi32 - lo32)) + lo32)
        self.draws.append(("u", lo32, hi32, v))
        return v

    def randint(self, lo, hi):
        v = self.r.randrange(lo, hi)
        self.draws.append(("i", lo, hi, v))
        return v


def rrc_get_params_transcribed(rec, width, height, scale, ratio):
    # torchvision/transforms/transforms.py, RandomResizedCrop.get_params (v0.14), with
    # torch.empty(1).uniform_ and torch.randint replaced by the recorder
    area = height * width
    log_ratio = (f32(math.log(f32(ratio[0]))), f32(math.log(f32(ratio[1]))))
    for attempt in range(10):
        target_area = area * rec.uniform(scale[0], scale[1])
        aspect_ratio = f32(math.exp(rec.uniform(log_ratio[0], log_ratio[1])))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = rec.randint(0, height - h + 1)
            j = rec.randint(0, width - w + 1)
            return i, j, h, w, attempt + 1
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    i = (height - h) // 2
    j = (width - w) // 2
    return i, j, h, w, 0


def rrc_case_torch(seed, width, height, scale, ratio):
    """Draws replayed from torch's generator next to torchvision's own answer."""
    torch.manual_seed(seed)
    draws = []
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    result = None
    for attempt in range(10):
        s = torch.empty(1).uniform_(scale[0], scale[1]).item()
        draws.append(("u", f32(scale[0]), f32(scale[1]), s))
        lr = torch.empty(1).uniform_(log_ratio[0], log_ratio[1])
        draws.append(("u", log_ratio[0].item(), log_ratio[1].item(), lr.item()))
        aspect_ratio = torch.exp(lr).item()
        target_area = area * s
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,)).item()
            draws.append(("i", 0, height - h + 1, i))
            j = torch.randint(0, width - w + 1, size=(1,)).item()
            draws.append(("i", 0, width - w + 1, j))
            result = (i, j, h, w, attempt + 1)
            break
    torch.manual_seed(seed)
    img = torch.zeros(1, height, width)
    i, j, h, w = T.RandomResizedCrop.get_params(img, list(scale), list(ratio))
    if result is None:
        result = (i, j, h, w, 0)
    assert (i, j, h, w) == result[:4], "replay disagrees with torchvision"
    return draws, result


def write_rrc(path):
    cases = []
    sizes = [(500, 375), (375, 500), (224, 224), (32, 32), (28, 28), (1000, 10), (10, 1000),
             (3, 2), (640, 480), (1, 1), (7, 300)]
    scales = [(0.08, 1.0), (0.5, 1.0), (0.9, 1.0)]
    ratio = (3.0 / 4.0, 4.0 / 3.0)
    seed = 0
    for (w, h) in sizes:
        for scale in scales:
            for _ in range(6):
                seed += 1
                if HAVE_TORCH:
                    draws, res = rrc_case_torch(seed, w, h, scale, ratio)
                else:
                    rec = Recorder(seed)
                    res = rrc_get_params_transcribed(rec, w, h, scale, ratio)
                    draws = rec.draws
                cases.append((w, h, scale, ratio, draws, res))
    # ratios that make every try fail: the fallback's three branches
    for (w, h, ratio2) in [(1000, 10, (3 / 4, 4 / 3)), (10, 1000, (3 / 4, 4 / 3)), (100, 100, (5.0, 6.0)),
                           (100, 100, (0.1, 0.2)), (50, 60, (1.0, 1.0))]:
        seed += 1
        rec = Recorder(seed)
        res = rrc_get_params_transcribed(rec, w, h, (1.0, 1.0), ratio2) if not HAVE_TORCH else None
        if HAVE_TORCH:
            draws, res = rrc_case_torch(seed, w, h, (1.0, 1.0), ratio2)
        else:
            draws = rec.draws
        cases.append((w, h, (1.0, 1.0), ratio2, draws, res))
    with open(path, "w") as f:
        src = ("torch %s / torchvision %s" % (torch.__version__, torchvision.__version__)) if HAVE_TORCH \
            else "a transcription of torchvision 0.14's get_params (torchvision not installed)"
        f.write("# RandomResizedCrop.get_params goldens from %s, by scripts/make_data_goldens.py\n" % src)
        f.write("# W H scale_min scale_max ratio_min ratio_max ndraws {u lo hi value | i lo hi value}... "
                "top left h w tries\n")
        for (w, h, scale, ratio2, draws, res) in cases:
            toks = ["%d %d %.17g %.17g %.17g %.17g %d" % (w, h, scale[0], scale[1], ratio2[0], ratio2[1], len(draws))]
            for d in draws:
                if d[0] == "u":
                    toks.append("u %.9g %.9g %.9g" % (d[1], d[2], d[3]))
                else:
                    toks.append("i %d %d %d" % (d[1], d[2], d[3]))
            toks.append("%d %d %d %d %d" % res)
            f.write(" ".join(toks) + "\n")
    return len(cases)


# ---------------------------------------------------------------- DistributedSampler


def dist_sampler_transcribed(n, replicas, rank, drop_last):
    # torch/utils/data/distributed.py (1.13): __init__'s num_samples and __iter__ with
    # shuffle=False
    if drop_last and n % replicas != 0:
        num_samples = math.ceil((n - replicas) / replicas)
    else:
        num_samples = math.ceil(n / replicas)
    total_size = num_samples * replicas
    indices = list(range(n))
    if not drop_last:
        padding_size = total_size - len(indices)
        if padding_size <= len(indices):
            indices += indices[:padding_size]
        else:
            indices += (indices * math.ceil(padding_size / len(indices)))[:padding_size]
    else:
        indices = indices[:total_size]
    assert len(indices) == total_size
    indices = indices[rank:total_size:replicas]
    assert len(indices) == num_samples
    return indices


def dist_sampler(n, replicas, rank, drop_last):
    if HAVE_TORCH:
        from torch.utils.data import DistributedSampler

        s = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=False,
                               drop_last=drop_last)
        return list(iter(s))
    return dist_sampler_transcribed(n, replicas, rank, drop_last)


def ra_sampler_transcribed(n, replicas, rank, reps):
    # torchvision's references/classification/sampler.py, RASampler.__init__ and __iter__
    # with shuffle=False (the references are not part of the torchvision package)
    num_samples = int(math.ceil(n * float(reps) / replicas))
    total_size = num_samples * replicas
    num_selected_samples = int(math.floor(n // 256 * 256 / replicas))
    indices = list(range(n))
    indices = [ele for ele in indices for i in range(reps)]
    indices += indices[: (total_size - len(indices))]
    assert len(indices) == total_size
    indices = indices[rank:total_size:replicas]
    assert len(indices) == num_samples
    return indices[:num_selected_samples]


def write_ra_sampler(path):
    count = 0
    with open(path, "w") as f:
        f.write("# RASampler(shuffle=False) goldens from a transcription of torchvision's "
                "references/classification/sampler.py, by scripts/make_data_goldens.py\n")
        f.write("# n replicas reps rank count indices...\n")
        for n in [256, 300, 517]:
            for replicas in [1, 2, 3, 8]:
                for reps in [1, 3, 4]:
                    for rank in range(replicas):
                        idx = ra_sampler_transcribed(n, replicas, rank, reps)
                        f.write("%d %d %d %d %d %s\n" % (n, replicas, reps, rank, len(idx),
                                                         " ".join(map(str, idx))))
                        count += 1
    return count


def write_sampler(path):
    count = 0
    with open(path, "w") as f:
        src = "torch %s" % torch.__version__ if HAVE_TORCH else \
            "a transcription of torch 1.13's DistributedSampler (torch not installed)"
        f.write("# DistributedSampler(shuffle=False) goldens from %s, by scripts/make_data_goldens.py\n" % src)
        f.write("# n replicas drop_last rank count indices...\n")
        for n in [1, 2, 3, 5, 7, 8, 10, 13, 16, 17, 31, 100, 101]:
            for replicas in range(1, 9):
                if replicas > n:
                    continue
                for drop_last in (0, 1):
                    for rank in range(replicas):
                        idx = dist_sampler(n, replicas, rank, bool(drop_last))
                        f.write("%d %d %d %d %d %s\n" % (n, replicas, drop_last, rank, len(idx),
                                                         " ".join(map(str, idx))))
                        count += 1
    return count


# ---------------------------------------------------------------- PIL resize and gray


def write_resize(path):
    rs = np.random.RandomState(1234)
    cases = [
        # channels, w, h, box (left, top, w, h) or None, out_w, out_h
        (3, 23, 17, None, 7, 5),
        (3, 23, 17, None, 40, 30),
        (3, 23, 17, (3, 2, 15, 11), 8, 8),
        (3, 23, 17, (5, 4, 6, 9), 16, 16),
        (3, 23, 17, None, 23, 17),
        (1, 64, 48, None, 5, 4),
        (1, 64, 48, (10, 7, 40, 33), 12, 12),
        (1, 9, 13, None, 31, 29),
        (1, 31, 2, None, 3, 7),
        (3, 50, 37, (0, 0, 50, 37), 50, 20),
        (1, 5, 5, (1, 1, 3, 3), 60, 60),
    ]
    with open(path, "w") as f:
        f.write("# PIL %s: img.crop(box).resize((out_w, out_h), Image.BILINEAR), by "
                "scripts/make_data_goldens.py\n" % Image.__version__)
        f.write("# C W H left top bw bh out_w out_h, then the input pixels (HWC, hex), then the output\n")
        for (c, w, h, box, ow, oh) in cases:
            px = rs.randint(0, 256, size=(h, w, c)).astype(np.uint8)
            # some structure too: a bright bar, so edges matter
            px[h // 3, :, :] = 255
            img = Image.fromarray(px[:, :, 0] if c == 1 else px, "L" if c == 1 else "RGB")
            bl, bt, bw, bh = box if box else (0, 0, w, h)
            res = img.crop((bl, bt, bl + bw, bt + bh)).resize((ow, oh), Image.BILINEAR)
            out = np.asarray(res).reshape(oh, ow, c)
            f.write("%d %d %d %d %d %d %d %d %d\n" % (c, w, h, bl, bt, bw, bh, ow, oh))
            f.write(px.tobytes().hex() + "\n")
            f.write(out.tobytes().hex() + "\n")
    return len(cases)


def write_resize_interp(path):
    rs = np.random.RandomState(4321)
    cases = [
        (3, 23, 17, None, 7, 5), (3, 23, 17, None, 40, 30), (3, 23, 17, (3, 2, 15, 11), 8, 8),
        (1, 64, 48, (10, 7, 40, 33), 12, 12), (1, 9, 13, None, 31, 29), (3, 50, 37, None, 50, 20),
        (1, 5, 5, (1, 1, 3, 3), 60, 60), (3, 31, 29, (4, 5, 20, 19), 13, 21),
    ]
    modes = [("nearest", Image.NEAREST), ("bicubic", Image.BICUBIC)]
    n = 0
    with open(path, "w") as f:
        f.write("# PIL %s: img.crop(box).resize((out_w, out_h), NEAREST or BICUBIC), by "
                "scripts/make_data_goldens.py\n" % Image.__version__)
        f.write("# interp C W H left top bw bh out_w out_h, then the input pixels (HWC, hex), then "
                "the output\n")
        for (c, w, h, box, ow, oh) in cases:
            px = rs.randint(0, 256, size=(h, w, c)).astype(np.uint8)
            px[h // 3, :, :] = 255
            px[:, w // 2, :] = 0
            img = Image.fromarray(px[:, :, 0] if c == 1 else px, "L" if c == 1 else "RGB")
            bl, bt, bw, bh = box if box else (0, 0, w, h)
            for name, mode in modes:
                res = img.crop((bl, bt, bl + bw, bt + bh)).resize((ow, oh), mode)
                out = np.asarray(res).reshape(oh, ow, c)
                f.write("%s %d %d %d %d %d %d %d %d %d\n" % (name, c, w, h, bl, bt, bw, bh, ow, oh))
                f.write(px.tobytes().hex() + "\n")
                f.write(out.tobytes().hex() + "\n")
                n += 1
    return n


def write_gray(path):
    rs = np.random.RandomState(99)
    rgb = rs.randint(0, 256, size=(1, 250, 3)).astype(np.uint8)
    extra = np.array([[0, 0, 0], [255, 255, 255], [255, 0, 0], [0, 255, 0], [0, 0, 255], [1, 2, 3]],
                     dtype=np.uint8).reshape(1, 6, 3)
    rgb = np.concatenate([rgb, extra], axis=1)
    gray = np.asarray(Image.fromarray(rgb, "RGB").convert("L"))
    with open(path, "w") as f:
        f.write("# PIL %s: Image.convert('L') of RGB pixels, by scripts/make_data_goldens.py\n" % Image.__version__)
        f.write("# count, then the RGB pixels (hex), then the L values (hex)\n")
        f.write("%d\n%s\n%s\n" % (rgb.shape[1], rgb.tobytes().hex(), gray.tobytes().hex()))
    return rgb.shape[1]


def photo(w, h, seed):
    """A smooth picture with edges and a little noise: what JPEG is made for."""
    rs = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    img[..., 0] = 128 + 90 * np.sin(x / 7.0)
    img[..., 1] = 60 + 150 * (y / h)
    img[..., 2] = 200 - 120 * (x / w)
    img[(x - w / 2) ** 2 + (y - h / 2) ** 2 < (h / 4) ** 2] = (250, 240, 30)
    img += rs.normal(0, 4, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_jpegs(outdir):
    """JPEG files written by libjpeg (through PIL) and PIL's decoding of each: stb_image must
    read them as libjpeg does, within IDCT and upsampling differences."""
    px = photo(64, 48, 7)
    rgb = Image.fromarray(px, "RGB")
    files = [
        ("photo444.jpg", rgb, dict(quality=95, subsampling=0)),
        ("photo420.jpg", rgb, dict(quality=90, subsampling=2)),
        ("progressive.jpg", rgb, dict(quality=90, progressive=True)),
        ("gray.jpg", rgb.convert("L"), dict(quality=90)),
        ("cmyk.jpg", rgb.convert("CMYK"), dict(quality=95)),
    ]
    with open(os.path.join(outdir, "jpeg.txt"), "w") as f:
        f.write("# JPEG files made by PIL %s (libjpeg) and PIL's decoding of each, by "
                "scripts/make_data_goldens.py\n" % Image.__version__)
        f.write("# name w h channels, then the decoded pixels (PIL's convert('RGB') or 'L', hex)\n")
        for name, img, kw in files:
            path = os.path.join(outdir, name)
            img.save(path, "JPEG", **kw)
            back = Image.open(path)
            back.load()
            ch = 1 if back.mode == "L" else 3
            dec = np.asarray(back.convert("L" if ch == 1 else "RGB"))
            f.write("%s %d %d %d\n%s\n" % (name, back.width, back.height, ch, dec.tobytes().hex()))
    return len(files)


# ---------------------------------------------------------------- policy ops


def aug_images():
    """Small fixed images: colour (not square), colour (square, for the exact 90-degree
    rotations), gray; gradients, a bright bar and noise, so that every op changes them."""
    rs = np.random.RandomState(2024)
    out = []
    for (w, h, c) in [(20, 14, 3), (12, 12, 3), (20, 14, 1)]:
        y, x = np.mgrid[0:h, 0:w].astype(np.float64)
        img = np.zeros((h, w, 3))
        img[..., 0] = 60 + 120 * x / w
        img[..., 1] = 40 + 150 * y / h
        img[..., 2] = 128 + 80 * np.sin(x / 3.0 + y / 4.0)
        img[h // 3, :, :] = 235
        img += rs.randint(-12, 13, img.shape)
        img = np.clip(img, 0, 255).astype(np.uint8)
        out.append(img if c == 3 else np.asarray(Image.fromarray(img, "RGB").convert("L")))
    return out


def write_augment_ops(path):
    from torchvision.transforms import InterpolationMode as IM
    from torchvision.transforms.autoaugment import _apply_op

    imgs = aug_images()
    interps = [("nearest", IM.NEAREST), ("bilinear", IM.BILINEAR), ("bicubic", IM.BICUBIC)]
    geometric = [("ShearX", [0.3, -0.17, 0.99]), ("ShearY", [0.3, -0.17, 0.99]),
                 ("TranslateX", [5.7, -3.2, 12.0]), ("TranslateY", [5.7, -3.2, 12.0]),
                 ("Rotate", [30.0, -13.5, 90.0, -90.0, 135.0, 180.0])]
    enhance = [(op, [0.9, -0.5, 0.33, -0.99, 0.0])
               for op in ("Brightness", "Color", "Contrast", "Sharpness")]
    lut = [("Posterize", [8.0, 4.0, 2.0, 0.0]), ("Solarize", [255.0, 128.0, 100.5, 0.0]),
           ("AutoContrast", [0.0]), ("Equalize", [0.0]), ("Invert", [0.0]), ("Identity", [0.0])]
    cases = []
    for k, img in enumerate(imgs):
        for op, mags in geometric:
            for iname, imode in interps:
                for m in mags:
                    cases.append((op, iname, imode, m, k))
        for op, mags in enhance + lut:
            for m in mags:
                cases.append((op, "bilinear", IM.BILINEAR, m, k))
    with gz_lines(path) as line:
        line("# torchvision %s autoaugment._apply_op on PIL %s images, by "
             "scripts/make_data_goldens.py" % (torchvision.__version__, Image.__version__))
        line("# images: count, then per image 'w h c' and its pixels (HWC, hex); cases: count, "
             "then per case 'op interpolation magnitude image' and the output pixels")
        line("%d" % len(imgs))
        for img in imgs:
            h, w = img.shape[:2]
            c = 1 if img.ndim == 2 else 3
            line("%d %d %d" % (w, h, c))
            line(img.tobytes().hex())
        line("%d" % len(cases))
        for op, iname, imode, m, k in cases:
            pil = Image.fromarray(imgs[k], "L" if imgs[k].ndim == 2 else "RGB")
            out = np.asarray(_apply_op(pil, op, m, interpolation=imode, fill=None))
            line("%s %s %.17g %d" % (op, iname, m, k))
            line(out.tobytes().hex())
    return len(cases)


def write_augment_space(path):
    from torchvision.transforms import autoaugment as A

    with open(path, "w") as f:
        f.write("# torchvision %s: _augmentation_space of each policy and AutoAugmentPolicy.IMAGENET, "
                "by scripts/make_data_goldens.py\n" % torchvision.__version__)
        f.write("# space POLICY BINS H W OPS, then per op 'name signed count values...'; "
                "then 'imagenet 25' and per sub-policy 'op p bin op p bin' (bin -1: none)\n")
        spaces = [("ta_wide", 31, 0, 0, A.TrivialAugmentWide()._augmentation_space(31)),
                  ("ra", 31, 30, 40, A.RandAugment()._augmentation_space(31, (30, 40))),
                  ("ra", 31, 224, 224, A.RandAugment()._augmentation_space(31, (224, 224))),
                  ("imagenet", 10, 30, 40, A.AutoAugment()._augmentation_space(10, (30, 40))),
                  ("augmix", 10, 30, 40, A.AugMix()._augmentation_space(10, (30, 40)))]
        for name, bins, h, w, space in spaces:
            f.write("space %s %d %d %d %d\n" % (name, bins, h, w, len(space)))
            for op, (mags, signed) in space.items():
                vals = [float(v) for v in mags.reshape(-1).tolist()] if mags.ndim > 0 else []
                f.write("%s %d %d %s\n" % (op, int(signed), len(vals),
                                           " ".join("%.9g" % v for v in vals)))
        for name, policy in (("imagenet", A.AutoAugmentPolicy.IMAGENET),
                             ("cifar10", A.AutoAugmentPolicy.CIFAR10),
                             ("svhn", A.AutoAugmentPolicy.SVHN)):
            pol = A.AutoAugment(policy).policies
            f.write("%s %d\n" % (name, len(pol)))
            for (a, b) in pol:
                f.write("%s %.9g %d %s %.9g %d\n" % (a[0], a[1], -1 if a[2] is None else a[2],
                                                    b[0], b[1], -1 if b[2] is None else b[2]))
    return len(spaces)


def chw(img):
    """An HWC (or HW) uint8 array as the CHW uint8 tensor AugMix works on."""
    a = img if img.ndim == 3 else img[:, :, None]
    return torch.from_numpy(a.transpose(2, 0, 1).copy())


def hwc_hex(t):
    return t.permute(1, 2, 0).contiguous().numpy().tobytes().hex()


def write_augmix_ops(path):
    from torchvision.transforms import InterpolationMode as IM
    from torchvision.transforms.autoaugment import _apply_op

    imgs = aug_images()
    ops = [("ShearX", [0.3, -0.17, 0.099]), ("ShearY", [0.3, -0.17, 0.099]),
           ("TranslateX", [5.7, -3.2, 13.3]), ("TranslateY", [5.7, -3.2, 9.9]),
           ("Rotate", [30.0, -13.5, 3.33, 90.0]),
           ("Brightness", [0.9, -0.5, 0.33, -0.99, 0.0]), ("Color", [0.9, -0.5, 0.33, -0.99]),
           ("Contrast", [0.9, -0.5, 0.33, -0.99]), ("Sharpness", [0.9, -0.5, 0.33, -0.99]),
           ("Posterize", [4.0, 3.0, 1.0, 0.0]), ("Solarize", [255.0, 128.0, 100.5, 0.0]),
           ("AutoContrast", [0.0]), ("Equalize", [0.0])]
    cases = [(op, m, k) for k in range(len(imgs)) for op, mags in ops for m in mags]
    with gz_lines(path) as line:
        line("# torchvision %s / torch %s autoaugment._apply_op on uint8 CHW tensors (bilinear, "
             "fill None), as AugMix calls it, by scripts/make_data_goldens.py"
             % (torchvision.__version__, torch.__version__))
        line("# cases: count, then per case 'op magnitude image' and the output pixels (HWC, hex) "
             "of augment_ops.txt.gz's images")
        line("%d" % len(cases))
        for op, m, k in cases:
            out = _apply_op(chw(imgs[k]), op, m, interpolation=IM.BILINEAR, fill=None)
            line("%s %.17g %d" % (op, m, k))
            line(hwc_hex(out))
    return len(cases)


def write_augmix(path):
    """AugMix(severity).forward on each image with torch's draws recorded: the two Dirichlet
    samples (through _sample_dirichlet) and every torch.randint (a chain's depth, an op, a
    magnitude bin, a sign), in the order forward makes them."""
    from torchvision.transforms import autoaugment as A

    imgs = aug_images()
    draws = []

    class Recorded(A.AugMix):
        def _sample_dirichlet(self, params):
            out = super()._sample_dirichlet(params)
            draws.append(("d", [float(v) for v in out.reshape(-1).tolist()]))
            return out

    real_randint = torch.randint

    def randint(*args, **kw):
        out = real_randint(*args, **kw)
        draws.append(("r", [int(out.reshape(-1)[0])]))
        return out

    cases = 0
    with gz_lines(path) as line:
        line("# torchvision %s / torch %s AugMix(severity) on uint8 CHW tensors, its draws recorded, "
             "by scripts/make_data_goldens.py" % (torchvision.__version__, torch.__version__))
        line("# per case 'image severity ndraws', then the draws in order ('d' and the Dirichlet "
             "sample as float32 hex, or 'r' and the randint), then the output pixels (HWC, hex)")
        torch.manual_seed(2025)
        torch.randint = randint
        try:
            for k in range(len(imgs)):
                for severity in (1, 3, 10):
                    for rep in range(6):
                        draws.clear()
                        out = Recorded(severity=severity)(chw(imgs[k]))
                        line("%d %d %d" % (k, severity, len(draws)))
                        for kind, vals in draws:
                            if kind == "d":
                                line("d " + np.asarray(vals, dtype=np.float32).tobytes().hex())
                            else:
                                line("r %d" % vals[0])
                        line(hwc_hex(out))
                        cases += 1
        finally:
            torch.randint = real_randint
    return cases


def write_erase(path):
    cases = []
    seed = 1000
    for (w, h) in [(224, 224), (32, 32), (20, 14), (3, 2), (1, 1), (300, 7)]:
        for _ in range(8):
            seed += 1
            torch.manual_seed(seed)
            draws = []
            area = h * w
            scale, ratio = (0.02, 0.33), (0.3, 3.3)
            log_ratio = torch.log(torch.tensor(ratio))
            res = None
            for attempt in range(10):
                s = torch.empty(1).uniform_(scale[0], scale[1]).item()
                draws.append(("u", f32(scale[0]), f32(scale[1]), s))
                lr = torch.empty(1).uniform_(log_ratio[0], log_ratio[1])
                draws.append(("u", log_ratio[0].item(), log_ratio[1].item(), lr.item()))
                aspect = torch.exp(lr).item()
                eh = int(round(math.sqrt(area * s * aspect)))
                ew = int(round(math.sqrt(area * s / aspect)))
                if not (eh < h and ew < w):
                    continue
                i = torch.randint(0, h - eh + 1, size=(1,)).item()
                draws.append(("i", 0, h - eh + 1, i))
                j = torch.randint(0, w - ew + 1, size=(1,)).item()
                draws.append(("i", 0, w - ew + 1, j))
                res = (i, j, eh, ew, attempt + 1)
                break
            torch.manual_seed(seed)
            img = torch.zeros(3, h, w)
            i, j, eh, ew, _v = T.RandomErasing.get_params(img, scale=scale, ratio=ratio, value=[0])
            if res is None:
                res = (i, j, eh, ew, 0)
            assert (i, j, eh, ew) == res[:4], "replay disagrees with torchvision"
            cases.append((w, h, draws, res))
    with open(path, "w") as f:
        f.write("# RandomErasing.get_params(scale=(0.02, 0.33), ratio=(0.3, 3.3), value=[0]) from torch "
                "%s / torchvision %s, by scripts/make_data_goldens.py\n" % (torch.__version__,
                                                                           torchvision.__version__))
        f.write("# W H ndraws {u lo hi value | i lo hi value}... top left h w tries\n")
        for (w, h, draws, res) in cases:
            toks = ["%d %d %d" % (w, h, len(draws))]
            for d in draws:
                toks.append(("u %.9g %.9g %.9g" if d[0] == "u" else "i %d %d %d") % d[1:])
            toks.append("%d %d %d %d %d" % res)
            f.write(" ".join(toks) + "\n")
    return len(cases)


# ---------------------------------------------------------------- mixup, cutmix, the loss


def references_mixup(batch, target, num_classes, lam):
    # references/classification/transforms.py (v0.14) RandomMixup.forward after its draws
    # (p = 1, inplace False); lambda_param comes in instead of torch._sample_dirichlet
    batch = batch.clone()
    target = target.clone()
    target = torch.nn.functional.one_hot(target, num_classes=num_classes).to(dtype=batch.dtype)
    batch_rolled = batch.roll(1, 0)
    target_rolled = target.roll(1, 0)
    lambda_param = float(lam)
    batch_rolled.mul_(1.0 - lambda_param)
    batch.mul_(lambda_param).add_(batch_rolled)
    target_rolled.mul_(1.0 - lambda_param)
    target.mul_(lambda_param).add_(target_rolled)
    return batch, target


def references_cutmix(batch, target, num_classes, lam, r_x, r_y):
    # RandomCutmix.forward after its draws; r_x, r_y come in instead of torch.randint
    batch = batch.clone()
    target = target.clone()
    target = torch.nn.functional.one_hot(target, num_classes=num_classes).to(dtype=batch.dtype)
    batch_rolled = batch.roll(1, 0)
    target_rolled = target.roll(1, 0)
    lambda_param = float(lam)
    _, H, W = batch.shape[-3:]
    r = 0.5 * math.sqrt(1.0 - lambda_param)
    r_w_half = int(r * W)
    r_h_half = int(r * H)
    x1 = int(torch.clamp(torch.tensor(r_x - r_w_half), min=0))
    y1 = int(torch.clamp(torch.tensor(r_y - r_h_half), min=0))
    x2 = int(torch.clamp(torch.tensor(r_x + r_w_half), max=W))
    y2 = int(torch.clamp(torch.tensor(r_y + r_h_half), max=H))
    batch[:, :, y1:y2, x1:x2] = batch_rolled[:, :, y1:y2, x1:x2]
    lambda_param = float(1.0 - (x2 - x1) * (y2 - y1) / (W * H))
    target_rolled.mul_(1.0 - lambda_param)
    target.mul_(lambda_param).add_(target_rolled)
    return batch, target, lambda_param


def hexf(t):
    return t.detach().contiguous().numpy().astype("<f4").tobytes().hex()


def write_mix(path):
    g = torch.Generator().manual_seed(77)
    batch = torch.randn(3, 2, 5, 6, generator=g)
    target = torch.tensor([1, 3, 3])
    K = 4
    with open(path, "w") as f:
        f.write("# mixup/cutmix (a transcription of torchvision %s's references RandomMixup and "
                "RandomCutmix) and torch %s's CrossEntropyLoss with soft targets, by "
                "scripts/make_data_goldens.py\n" % (torchvision.__version__, torch.__version__))
        f.write("# batch N C H W K, the images (float32 hex) and labels; 'mixup lam' or 'cutmix lam "
                "rx ry lam_out', then the images and targets [N,K]; 'loss n K eps', logits, "
                "labels a, labels b, weights, then the mean loss and dloss/dlogits\n")
        f.write("batch 3 2 5 6 %d\n%s\n%s\n" % (K, hexf(batch), " ".join(map(str, target.tolist()))))
        n = 0
        for lam in (0.3, 0.7771, 1.0, 0.0):
            out, tgt = references_mixup(batch, target, K, lam)
            f.write("mixup %.17g\n%s\n%s\n" % (lam, hexf(out), hexf(tgt)))
            n += 1
        for lam, rx, ry in ((0.3, 2, 1), (0.9, 5, 4), (0.05, 0, 0), (0.6, 3, 2)):
            out, tgt, lo = references_cutmix(batch, target, K, lam, rx, ry)
            f.write("cutmix %.17g %d %d %.17g\n%s\n%s\n" % (lam, rx, ry, lo, hexf(out), hexf(tgt)))
            n += 1
        for (rows, classes, eps) in ((5, 7, 0.0), (5, 7, 0.1), (16, 10, 0.2), (3, 2, 0.0)):
            logits = (torch.randn(rows, classes, generator=g) * 2).requires_grad_(True)
            a = torch.randint(classes, (rows,), generator=g)
            b = torch.randint(classes, (rows,), generator=g)
            b[0] = a[0]
            w = torch.rand(rows, generator=g)
            w[1] = 0.5
            soft = w[:, None] * torch.nn.functional.one_hot(a, classes).float() + \
                (1 - w[:, None]) * torch.nn.functional.one_hot(b, classes).float()
            loss = torch.nn.CrossEntropyLoss(label_smoothing=eps)(logits, soft)
            loss.backward()
            f.write("loss %d %d %.9g\n%s\n%s\n%s\n%s\n%.9g\n%s\n" % (
                rows, classes, eps, hexf(logits), " ".join(map(str, a.tolist())),
                " ".join(map(str, b.tolist())), hexf(w), loss.item(), hexf(logits.grad)))
            n += 1
    return n


def main():
    os.makedirs(OUT, exist_ok=True)
    print("ra_sampler.txt: %d lines" % write_ra_sampler(os.path.join(OUT, "ra_sampler.txt")))
    if sys.argv[1:] == ["ra_sampler"]:
        return
    print("rrc.txt: %d cases" % write_rrc(os.path.join(OUT, "rrc.txt")))
    print("sampler.txt: %d lines" % write_sampler(os.path.join(OUT, "sampler.txt")))
    if HAVE_PIL:
        print("resize.txt: %d cases" % write_resize(os.path.join(OUT, "resize.txt")))
        print("resize_interp.txt: %d cases" % write_resize_interp(os.path.join(OUT, "resize_interp.txt")))
        print("gray.txt: %d pixels" % write_gray(os.path.join(OUT, "gray.txt")))
        print("jpeg.txt: %d files" % write_jpegs(OUT))
    else:
        print("PIL missing (apt-get install python3-pil): resize.txt and gray.txt left as they are",
              file=sys.stderr)
    if HAVE_TORCH and HAVE_PIL:
        print("augment_ops.txt.gz: %d cases" % write_augment_ops(os.path.join(OUT, "augment_ops.txt.gz")))
        print("augment_space.txt: %d spaces" % write_augment_space(os.path.join(OUT, "augment_space.txt")))
        print("augmix_ops.txt.gz: %d cases" % write_augmix_ops(os.path.join(OUT, "augmix_ops.txt.gz")))
        print("augmix.txt.gz: %d cases" % write_augmix(os.path.join(OUT, "augmix.txt.gz")))
        print("erase.txt: %d cases" % write_erase(os.path.join(OUT, "erase.txt")))
        print("mix.txt: %d cases" % write_mix(os.path.join(OUT, "mix.txt")))
    else:
        print("torch/torchvision missing: the augmentation goldens are left as they are",
              file=sys.stderr)
    if not HAVE_TORCH:
        print("torch/torchvision missing: rrc.txt and sampler.txt come from transcriptions of "
              "their published code", file=sys.stderr)


if __name__ == "__main__":
    main()
