"""``cnn.py`` written as a synchronous program: ``def main(kv, ctx)``, no ``await``.

The calls are GeoMX's MXNet ones: ``kv.push`` and ``kv.pull(..., out=)`` enqueue and
return, ``kv.waitall()`` and ``ctx.compute(...)`` block. geomx runs the program on a
thread of its own beside the node (docs/guide.md, "Synchronous programs"); in the
emulator its event log is ``cnn.py``'s, byte for byte. Run it with ``cnn.py``'s scenario:

    geomx run examples/cnn.toml --program examples/cnn_sync.py [--runtime real]
"""

from __future__ import annotations

import geomx.kv

from common import arg_parser, evaluate


def main(kv, ctx):
    p = arg_parser("cnn_sync.py", ctx)
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
    for k, param in enumerate(params):  # every worker inits, the others pull the master's
        kv.init(k, param)
        if not kv.is_master_worker:
            kv.pull(k, out=param)
    kv.waitall()
    if kv.is_master_worker:
        return  # the master worker does no training
    data = ctx.dataset()
    batches = ctx.batches(args.batch_size)
    for it in ctx.iterations():
        idx = batches.next()
        loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
        ctx.compute("per_iter")
        for k, g in enumerate(grads):
            kv.push(k, g, priority=-k)
            kv.pull(k, out=params[k], priority=-k)
        kv.waitall()
        evaluate(ctx, model, data, it, loss)
