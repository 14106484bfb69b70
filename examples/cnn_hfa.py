"""GeoMX's ``examples/cnn_hfa.py``: hierarchical frequency aggregation.

The scenario says ``[sync] algorithm = "hfa"`` with ``k1``/``k2`` (GeoMX: the
``MXNET_KVSTORE_USE_HFA``/``_HFA_K1``/``_HFA_K2`` variables, which ``geomx node`` maps
onto these fields). Workers take a local Adam step every iteration and every K1
iterations push ``params / num_workers`` and pull the DC (or, every K2-th time, the
global) average; accuracy is reported every K1*K2 iterations, when all models agree.
"""

from __future__ import annotations

from geomx.optim import create_optimizer

from common import arg_parser, evaluate, init_and_pull, keep_local_model


async def main(kv, ctx):
    args = arg_parser("cnn_hfa.py", ctx).parse_args(ctx.args)
    k1, k2 = ctx.sync["k1"], ctx.sync["k2"]
    assert ctx.sync["algorithm"] == "hfa" and k1 >= 1 and k2 >= 1
    model = ctx.build_model()
    params = model.params
    await init_and_pull(kv, params)
    if kv.is_master_worker:
        return
    opt = create_optimizer("adam", lr=args.learning_rate)
    states = [opt.create_state(k, w) for k, w in enumerate(params)]
    keep_local_model(ctx, params, states)
    data = ctx.dataset()
    batches = ctx.batches(args.batch_size)
    for it in ctx.iterations():
        idx = batches.next()
        loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
        await ctx.compute("per_iter")
        for k, g in enumerate(grads):
            opt.update(k, params[k], g, states[k])
        if it % k1 == 0:
            for k, w in enumerate(params):
                kv.push(k, w / kv.num_workers, priority=-k)
                kv.pull(k, out=w, priority=-k)
            await kv.waitall()
        evaluate(ctx, model, data, it, loss, every=k1 * k2)
