"""GeoMX's ``examples/cnn_mpq.py``: mixed-precision quantization.

Keys with more than ``--size-lower-bound`` elements travel fp32 and Bi-Sparse-compressed
between local and global servers (the master's ``set_gradient_compression``); the others
travel fp16 through their dtype, as in ``cnn_fp16.py``.
"""

from __future__ import annotations

import numpy as np

from geomx.optim import create_optimizer

from common import arg_parser, evaluate, keep_local_model


async def main(kv, ctx):
    p = arg_parser("cnn_mpq.py", ctx)
    p.add_argument("-bcr", "--bisparse-compression-ratio", type=float, default=0.01)
    p.add_argument("--size-lower-bound", type=int, default=1000)
    args = p.parse_args(ctx.args)
    if kv.is_master_worker:
        kv.set_gradient_compression({"type": "bsc", "threshold": args.bisparse_compression_ratio,
                                     "size_lower_bound": args.size_lower_bound})
    model = ctx.build_model()
    params = model.params
    dtypes = [np.float32 if w.size > args.size_lower_bound else np.float16 for w in params]
    bufs = [w.astype(dt) for w, dt in zip(params, dtypes)]
    for idx, b in enumerate(bufs):
        kv.init(idx, b)
        if not kv.is_master_worker:
            kv.pull(idx, out=b)
    await kv.waitall()
    for w, b in zip(params, bufs):
        w[...] = b
    if kv.is_master_worker:
        return
    opt = create_optimizer("adam", lr=args.learning_rate, rescale_grad=1.0 / kv.num_all_workers)
    states = [opt.create_state(k, w) for k, w in enumerate(params)]
    keep_local_model(ctx, params, states)
    data = ctx.dataset()
    batches = ctx.batches(args.batch_size)
    for it in ctx.iterations():
        idx = batches.next()
        loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
        await ctx.compute("per_iter")
        for k, g in enumerate(grads):
            kv.push(k, g.astype(dtypes[k]), priority=-k)
            kv.pull(k, out=bufs[k], priority=-k)
        await kv.waitall()
        for k, w in enumerate(params):
            opt.update(k, w, bufs[k].astype(np.float32), states[k])
        evaluate(ctx, model, data, it, loss)
