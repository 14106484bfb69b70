"""Programs that misuse ``geomx.torch`` in one way each (``training.program_args``:
``--case NAME``); the tests check the job fails naming the parameter and the node."""

import argparse

import torch
from torch import nn

import geomx.torch as hvd

UNLUCKY = "w:party-b:1"


async def main(kv, ctx):
    p = argparse.ArgumentParser()
    p.add_argument("--case", required=True)
    case = p.parse_args(ctx.args).case
    hvd.init(kv, ctx)
    torch.set_num_threads(1)
    data = ctx.dataset()
    torch.manual_seed(ctx.seed)
    c, h, w = data.input_shape
    model = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 16), nn.ReLU(),
                          nn.Linear(16, data.num_classes))
    if case == "extra_parameter" and ctx.node_name == UNLUCKY:
        model.add_module("extra", nn.Linear(data.num_classes, data.num_classes))
    if case == "renamed" and ctx.node_name == UNLUCKY:
        model = nn.Sequential(model)  # the same shapes, every name one level deeper
    if case == "meta_device" and ctx.node_name == UNLUCKY:
        model[3].bias = nn.Parameter(torch.empty(data.num_classes, device="meta"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if case == "server_adam":
        opt = torch.optim.Adam(model.parameters())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression="zstd" if case == "compression" else "none",
                                   server_optimizer=case == "server_adam",
                                   send_during_backward=case != "clip_from_step")
    await hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if hvd.is_master():
        return
    batches = ctx.batches()
    for it in ctx.iterations():
        opt.zero_grad()
        idx = batches.next()
        out = model(torch.from_numpy(data.x_train[idx]))
        loss = nn.functional.cross_entropy(out, torch.from_numpy(data.y_train[idx]))
        loss.backward()
        if case == "two_passes":
            nn.functional.cross_entropy(model(torch.from_numpy(data.x_train[idx])),
                                        torch.from_numpy(data.y_train[idx])).backward()
        if case in ("clip", "clip_from_step"):
            nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        if case == "blocking_step":
            opt.step()
        if case == "shape_change" and it == 3 and ctx.node_name == UNLUCKY:
            model[3].bias.data = torch.zeros(data.num_classes + 1)
        await opt.step_async()
