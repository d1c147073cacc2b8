# Times torchvision ImageFolder + DataLoader decode and augmentation (images/s in total and per worker), the counterpart of `mgtrain bench-data`, for tools/compare-pytorch.sh.
"""Data-loading benchmark: ImageFolder (PIL decode) + the training transforms, batched by
a DataLoader, for --seconds after the first batch. --workers 0 does everything on the main
thread (one thread); --workers N uses N worker processes (each one thread, as DataLoader
sets them up). Transforms, as mgtrain's loader does them:
  rrc:      RandomResizedCrop(size) + RandomHorizontalFlip + ToTensor + Normalize
  pad-crop: RandomCrop(size, padding=4) + RandomHorizontalFlip + ToTensor + Normalize
Images are read as 'L' with --channels 1 and 'RGB' with --channels 3. Prints one JSON
object on stdout.
"""

import argparse
import json
import os
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="dataset folder (DIR/train used if present)")
    p.add_argument("--transform", choices=["rrc", "pad-crop"], default="rrc")
    p.add_argument("--size", type=int, default=0, help="output side (default 224 for rrc, 28 for pad-crop)")
    p.add_argument("--channels", type=int, choices=[1, 3], default=3)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("-b", "--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=5)
    a = p.parse_args()

    import torch
    from PIL import Image
    from torchvision import datasets, transforms as T

    torch.set_num_threads(1)
    root = os.path.join(a.data, "train") if os.path.isdir(os.path.join(a.data, "train")) else a.data
    size = a.size or (224 if a.transform == "rrc" else 28)
    if a.channels == 1:
        mean, std = [0.4590], [0.2256]
    else:
        mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    crop = T.RandomResizedCrop(size) if a.transform == "rrc" else T.RandomCrop(size, padding=4)
    tf = T.Compose([crop, T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)])
    mode = "L" if a.channels == 1 else "RGB"

    def load(path):
        with open(path, "rb") as f:
            img = Image.open(f)
            return img.convert(mode)

    t_scan = time.perf_counter()
    ds = datasets.ImageFolder(root, transform=tf, loader=load)
    t_scan = time.perf_counter() - t_scan
    extra = {"persistent_workers": True, "prefetch_factor": 2} if a.workers > 0 else {}
    dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True,
                                     num_workers=a.workers, **extra)
    it = iter(dl)

    def next_batch():
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = iter(dl)
            return next(it)

    def cpu_seconds():
        """This process's CPU time and its DataLoader workers' (from /proc), so that a
        loaded machine's waits do not count."""
        total = time.process_time()
        its = getattr(dl, "_iterator", None)
        for w in getattr(its, "_workers", []) or []:
            try:
                with open("/proc/%d/stat" % w.pid) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, IndexError, ValueError):
                pass
        return total

    next_batch()  # start-up: worker processes, first batch
    n = 0
    t0 = time.perf_counter()
    c0 = cpu_seconds()
    while True:
        x, _ = next_batch()
        n += x.shape[0]
        elapsed = time.perf_counter() - t0
        if elapsed >= a.seconds:
            break
    cpu = cpu_seconds() - c0
    threads = max(a.workers, 1)
    print(json.dumps({
        "tool": "torchvision", "root": root, "files": len(ds), "scan_s": t_scan,
        "transform": a.transform, "size": size, "channels": a.channels, "workers": a.workers,
        "batch": a.batch, "images": n, "seconds": elapsed, "images_per_s": n / elapsed,
        "images_per_s_per_thread": n / elapsed / threads,
        "images_per_cpu_s": n / cpu if cpu > 0 else None,
    }))


if __name__ == "__main__":
    main()
