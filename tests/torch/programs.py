"""A training program the tests run: an MLP on the scenario's digits, written as a
Horovod user writes one, with ``geomx.torch``. Options (``training.program_args``):
``--sgd`` (momentum SGD; with ``--server`` it runs on the servers), ``--stage`` (CPU
tensors through the host staging buffers GPU tensors take), ``--fp16``, ``--passes N``
(backward passes per step), ``--sync`` (``def main``: a synchronous program),
``--report-early`` (after each backward pass, report how many parameters' exchanges it
started, and the model's digest)."""

import argparse

import torch
from torch import nn

import geomx.torch as hvd


def setup(kv, ctx):
    p = argparse.ArgumentParser()
    p.add_argument("--sgd", action="store_true")
    p.add_argument("--server", action="store_true")
    p.add_argument("--stage", action="store_true")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--passes", type=int, default=1)
    p.add_argument("--bn", action="store_true", help="a BatchNorm layer (an int64 buffer)")
    p.add_argument("--report-early", action="store_true")
    args, _ = p.parse_known_args(ctx.args)
    hvd.init(kv, ctx)
    torch.set_num_threads(1)
    data = ctx.dataset()
    # different initial weights on every node: broadcast_parameters makes them the master's
    torch.manual_seed(ctx.seed + max(0, ctx.worker_index) + 1)
    c, h, w = data.input_shape
    model = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 64),
                          nn.BatchNorm1d(64) if args.bn else nn.Identity(), nn.ReLU(),
                          nn.Linear(64, data.num_classes))
    opt = (torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if args.sgd
           else torch.optim.Adam(model.parameters(), lr=0.01))
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16 if args.fp16
                                   else hvd.Compression.none,
                                   backward_passes_per_step=args.passes,
                                   server_optimizer=args.server,
                                   stage_through_host=args.stage)
    return args, data, model, opt


def digest(model):
    """A checksum of the model's state (weights and buffers)."""
    return float(sum(t.double().sum().item() * (i + 1)
                     for i, t in enumerate(model.state_dict().values())))


def report_early(ctx, args, opt, model, it):
    if args.report_early:
        ctx.report(it, early=len(opt.started_in_backward), digest=digest(model))


def loss_of(model, data, idx):
    return nn.functional.cross_entropy(model(torch.from_numpy(data.x_train[idx])),
                                       torch.from_numpy(data.y_train[idx]))


def evaluate(ctx, model, data, it, loss):
    if ctx.is_evaluator and (it % ctx.eval_every == 0 or it == ctx.max_iterations):
        model.eval()  # (BatchNorm: evaluating must not move the running statistics)
        with torch.no_grad():
            out = model(torch.from_numpy(data.x_test))
            acc = (out.argmax(1) == torch.from_numpy(data.y_test)).float().mean().item()
        model.train()
        ctx.report(it, loss=loss.item(), accuracy=acc)


async def main(kv, ctx):
    args, data, model, opt = setup(kv, ctx)
    await hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    await hvd.broadcast_optimizer_state(opt, root_rank=0)
    ctx.report(0, start_digest=digest(model))
    if hvd.is_master():
        return
    batches = ctx.batches()
    for it in ctx.iterations():
        opt.zero_grad()
        for _ in range(args.passes):
            loss = loss_of(model, data, batches.next())
            loss.backward()
        report_early(ctx, args, opt, model, it)
        await opt.step_async()
        evaluate(ctx, model, data, it, loss)


def sync_main(kv, ctx):
    """``main`` as a synchronous program: the same calls, blocking, without ``await``."""
    args, data, model, opt = setup(kv, ctx)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    ctx.report(0, start_digest=digest(model))
    if hvd.is_master():
        return
    batches = ctx.batches()
    for it in ctx.iterations():
        opt.zero_grad()
        for _ in range(args.passes):
            loss = loss_of(model, data, batches.next())
            loss.backward()
        report_early(ctx, args, opt, model, it)
        opt.step()
        evaluate(ctx, model, data, it, loss)
