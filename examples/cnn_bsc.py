"""GeoMX's ``examples/cnn_bsc.py``: Bi-Sparse compression set by the master worker.

No global optimizer: the global servers sum, workers pull the aggregated gradient and
take a local Adam step scaled by 1/num_all_workers (gluon's ``trainer.step(num_all_workers)``).
``kv.set_gradient_compression`` from the master reaches every tier, as in GeoMX, so this
gives the same bytes and accuracy as ``[codec] type = "bsc"`` in the scenario
(``--scenario-codec`` skips the call, to compare).
"""

from __future__ import annotations

import numpy as np

from geomx.optim import create_optimizer

from common import arg_parser, evaluate, init_and_pull, keep_local_model


async def main(kv, ctx):
    p = arg_parser("cnn_bsc.py", ctx)
    p.add_argument("-bcr", "--bisparse-compression-ratio", type=float, default=0.01)
    p.add_argument("--size-lower-bound", type=int, default=1000,
                   help="GeoMX's MXNET_KVSTORE_SIZE_LOWER_BOUND (its scripts set 1000)")
    p.add_argument("--type", default="bsc",
                   help="codec to set (geomx also takes fp16, bf16, mpq, onebit this way)")
    p.add_argument("--scenario-codec", action="store_true",
                   help="leave compression to the scenario's [codec]")
    args = p.parse_args(ctx.args)
    if not 0 < args.bisparse_compression_ratio < 1:
        raise ValueError("--bisparse-compression-ratio must be in (0, 1)")
    if kv.is_master_worker and not args.scenario_codec:
        if args.type in ("bsc", "mpq"):
            kv.set_gradient_compression({"type": args.type,
                                         "threshold": args.bisparse_compression_ratio,
                                         "size_lower_bound": args.size_lower_bound})
        else:
            kv.set_gradient_compression({"type": args.type})
    model = ctx.build_model()
    params = model.params
    await init_and_pull(kv, params)
    if kv.is_master_worker:
        return
    opt = create_optimizer("adam", lr=args.learning_rate, rescale_grad=1.0 / kv.num_all_workers)
    states = [opt.create_state(k, w) for k, w in enumerate(params)]
    keep_local_model(ctx, params, states)
    summed = [np.zeros_like(w) for w in params]
    data = ctx.dataset()
    batches = ctx.batches(args.batch_size)
    for it in ctx.iterations():
        idx = batches.next()
        loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
        await ctx.compute("per_iter")
        for k, g in enumerate(grads):
            kv.push(k, g, priority=-k)
            kv.pull(k, out=summed[k], priority=-k)
        await kv.waitall()
        for k, w in enumerate(params):
            opt.update(k, w, summed[k], states[k])
        evaluate(ctx, model, data, it, loss)
