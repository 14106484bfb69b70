"""Training programs the tests run: an MLP on the scenario's digits, written as a Horovod
user writes one, with ``geomx.torch``."""

import torch
from torch import nn

import geomx.torch as hvd


def build(ctx):
    data = ctx.dataset()
    torch.manual_seed(ctx.seed + max(0, ctx.worker_index))  # different inits: broadcast fixes them
    c, h, w = data.input_shape
    return data, nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 64), nn.ReLU(),
                               nn.Linear(64, data.num_classes))


async def main(kv, ctx):
    hvd.init(kv, ctx)
    torch.set_num_threads(1)
    data, model = build(ctx)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    await hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if hvd.is_master():
        return
    x_test, y_test = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
    loss_fn = nn.CrossEntropyLoss()
    batches = ctx.batches()
    for it in ctx.iterations():
        idx = batches.next()
        opt.zero_grad()
        loss = loss_fn(model(torch.from_numpy(data.x_train[idx])),
                       torch.from_numpy(data.y_train[idx]))
        loss.backward()
        shared = await opt.step_async()
        if ctx.is_evaluator and it % ctx.eval_every == 0:
            with torch.no_grad():
                acc = (model(x_test).argmax(1) == y_test).float().mean().item()
            ctx.report(it, loss=loss.item(), accuracy=acc)
