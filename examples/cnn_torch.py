"""GeoMX's ``examples/cnn.py`` with a PyTorch model (``pip install 'geomx[torch]'``).

The model and its autograd are torch's; the kvstore moves numpy *views* of the torch
tensors (``p.grad.numpy()`` and ``p.data.numpy()`` share memory with the tensors), so a
pull writes straight into the model's weights. As in ``cnn.py``, the master worker
installs Adam on the global servers and workers push mean gradients and pull weights.
"""

from __future__ import annotations

import torch
from torch import nn

import geomx.kv

from common import arg_parser


def build(ctx, hidden: int) -> nn.Module:
    data = ctx.dataset()
    torch.manual_seed(ctx.seed)  # every node builds the same model (the master's wins anyway)
    c, h, w = data.input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, hidden), nn.ReLU(),
                         nn.Linear(hidden, data.num_classes))


async def main(kv, ctx):
    p = arg_parser("cnn_torch.py", ctx)
    p.add_argument("--hidden", type=int, default=256)
    args = p.parse_args(ctx.args)
    torch.set_num_threads(1)
    model = build(ctx, args.hidden)
    params = list(model.parameters())
    weights = [t.data.numpy() for t in params]  # views: pulling into them updates the model
    if kv.is_master_worker:
        kv.set_optimizer(geomx.kv.optimizer.Adam(learning_rate=args.learning_rate))
    for idx, w in enumerate(weights):
        kv.init(idx, w)
        if not kv.is_master_worker:
            kv.pull(idx, out=w)
    await kv.waitall()
    if kv.is_master_worker:
        return
    data = ctx.dataset()
    x_test, y_test = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
    loss_fn = nn.CrossEntropyLoss()  # mean over the batch: the mean gradient GeoMX pushes
    batches = ctx.batches(args.batch_size)
    for it in ctx.iterations():
        idx = batches.next()
        model.zero_grad()
        loss = loss_fn(model(torch.from_numpy(data.x_train[idx])),
                       torch.from_numpy(data.y_train[idx]))
        loss.backward()
        await ctx.compute("per_iter")
        for k, t in enumerate(params):
            kv.push(k, t.grad.numpy(), priority=-k)
            kv.pull(k, out=weights[k], priority=-k)
        await kv.waitall()
        if ctx.is_evaluator and (it % ctx.eval_every == 0 or it == ctx.max_iterations):
            with torch.no_grad():
                acc = (model(x_test).argmax(1) == y_test).float().mean().item()
            ctx.report(it, loss=loss.item(), accuracy=acc)
