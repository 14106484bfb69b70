"""GeoMX's ``examples/cnn.py`` as a geomx program: a global optimizer on the global servers.

The master worker installs Adam (or DCASGD with ``--dcasgd``) on the global servers and
publishes the initial model; workers push their mean gradients and pull the new weights.
``--mixed-sync`` creates a ``dist_async`` store (MixedSync: the scenario must say
``[sync] algorithm = "mixed"`` or nothing).
"""

from __future__ import annotations

import geomx.kv

from common import arg_parser, evaluate, init_and_pull


async def main(kv, ctx):
    p = arg_parser("cnn.py", ctx)
    p.add_argument("-ms", "--mixed-sync", action="store_true")
    p.add_argument("-dc", "--dcasgd", action="store_true")
    args = p.parse_args(ctx.args)
    if args.mixed_sync or args.dcasgd:
        kv = geomx.kv.create("dist_async")
    model = ctx.build_model()
    params = model.params
    if kv.is_master_worker:
        if args.dcasgd and not args.mixed_sync:
            kv.set_optimizer(geomx.kv.optimizer.DCASGD(learning_rate=args.learning_rate))
        else:
            kv.set_optimizer(geomx.kv.optimizer.Adam(learning_rate=args.learning_rate))
    await init_and_pull(kv, params)
    if kv.is_master_worker:
        return  # the master worker does no training
    data = ctx.dataset()
    batches = ctx.batches(args.batch_size)
    for it in ctx.iterations():
        idx = batches.next()
        loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
        await ctx.compute("per_iter")
        for k, g in enumerate(grads):
            kv.push(k, g, priority=-k)
            kv.pull(k, out=params[k], priority=-k)
        await kv.waitall()
        evaluate(ctx, model, data, it, loss)
