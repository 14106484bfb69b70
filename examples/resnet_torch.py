"""A ResNet-18 on CIFAR-10, written the way a Horovod user writes it, on geomx.

Run it as any geomx program (``geomx run examples/resnet_torch.toml``, add
``--runtime real`` for one process per node, or start each node by hand with
``geomx node``: docs/real-runtime.md); the scenario decides the WAN, the server tiers,
the codec and the sync algorithm. From a Horovod script only three things change:
``hvd.init(kv, ctx)``, the master worker returning once it has published the model, and
the iteration loop over ``ctx.iterations()`` (which stops the job together). It is a
synchronous program (``def main``), as Horovod scripts are; in an ``async def main`` the
waiting calls are ``await opt.step_async()`` and ``await hvd.broadcast_parameters(...)``.

The data are the CIFAR-10 python batches when they are there (``--cifar DIR``, or the
places geomx.ml.cifar looks), else seeded synthetic 32x32 colour images of ten classes,
identical on every machine. ``--width`` and ``--blocks`` shrink the network (the default
is ResNet-18: width 64, two blocks per stage, 11M parameters); ``--device cuda`` trains
on the GPU.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

import geomx.torch as hvd

#: the synthetic images' noise: a width-16 network needs some 70 steps of 128 images to
#: reach 80 % test accuracy on them
SYNTHETIC_NOISE = 1.2


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-18 for 32x32 inputs (a 3x3 stem, four stages of ``blocks`` basic blocks)."""

    def __init__(self, width: int = 64, blocks: int = 2, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        layers, cin = [], width
        for stage in range(4):
            cout = width * 2 ** stage
            for b in range(blocks):
                layers.append(BasicBlock(cin, cout, 2 if stage > 0 and b == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def cifar_or_synthetic(path: str | None, seed: int, samples: int):
    """(x_train, y_train, x_test, y_test) as float32 NCHW in [0, 1] and int64 labels."""
    from geomx.ml.cifar import load_cifar10
    from geomx.ml.dataset_types import DatasetNotFoundError

    try:
        d = load_cifar10(path)
        return (d.x_train.reshape(-1, 3, 32, 32), d.y_train,
                d.x_test.reshape(-1, 3, 32, 32), d.y_test)
    except DatasetNotFoundError:
        pass
    # ten classes, each a smooth random colour pattern; images are a class's pattern,
    # shifted and noised (learnable, but not by a linear model alone)
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 1, size=(10, 3, 8, 8)).astype(np.float32)
    patterns = coarse.repeat(4, axis=2).repeat(4, axis=3)
    n = samples + samples // 5
    y = rng.integers(0, 10, size=n)
    shifts = rng.integers(-3, 4, size=(n, 2))
    x = np.empty((n, 3, 32, 32), dtype=np.float32)
    for i in range(n):
        x[i] = np.roll(patterns[y[i]], tuple(shifts[i]), axis=(1, 2))
    x += rng.normal(0, SYNTHETIC_NOISE, size=x.shape).astype(np.float32)
    return x[:samples], y[:samples], x[samples:], y[samples:]


def parse(ctx):
    p = argparse.ArgumentParser(prog="resnet_torch.py")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=ctx.batch_size)
    p.add_argument("--samples", type=int, default=5000, help="synthetic training images")
    p.add_argument("--cifar", default=None, help="directory or .tar.gz of CIFAR-10")
    p.add_argument("--compression", default="none", help="none, fp16 (or a geomx codec)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where the model trains; cuda: every worker of a host shares its "
                        "GPU (gradients are staged through pinned host buffers)")
    return p.parse_args(ctx.args)


def main(kv, ctx):
    args = parse(ctx)
    hvd.init(kv, ctx)
    torch.manual_seed(ctx.seed)
    torch.set_num_threads(1)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("resnet_torch.py: --device cuda, but torch sees no GPU here")
    device = torch.device(args.device)
    model = ResNet(args.width, args.blocks).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=args.compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    if hvd.is_master():
        return  # the master worker publishes the model and trains nothing

    x, y, x_test, y_test = cifar_or_synthetic(args.cifar, ctx.seed, args.samples)
    x_test_d, y_test_d = torch.from_numpy(x_test).to(device), torch.from_numpy(y_test).to(device)
    shard = np.arange(hvd.rank(), len(x), hvd.size())
    rng = np.random.default_rng(ctx.seed + hvd.rank())
    for it in ctx.iterations():
        model.train()
        idx = rng.choice(shard, args.batch_size, replace=False)
        opt.zero_grad()
        xb = torch.from_numpy(x[idx]).to(device, non_blocking=True)
        yb = torch.from_numpy(y[idx]).to(device, non_blocking=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        if ctx.is_evaluator and (it % ctx.eval_every == 0 or it == ctx.max_iterations):
            model.eval()
            with torch.no_grad():
                pred = torch.cat([model(x_test_d[i:i + 500]).argmax(1)
                                  for i in range(0, len(x_test_d), 500)])
            ctx.report(it, loss=loss.item(), accuracy=(pred == y_test_d).float().mean().item())
