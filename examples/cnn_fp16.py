"""GeoMX's ``examples/cnn_fp16.py``: half-precision transfer through dtypes.

Every key is initialised from an fp16 copy of the parameter (so every replica starts
from fp16-rounded weights), workers push ``grad.astype(float16)`` and pull the fp16
aggregate, cast back to fp32 for a local Adam step scaled by 1/num_all_workers.
"""

from __future__ import annotations

import numpy as np

from geomx.optim import create_optimizer

from common import arg_parser, evaluate, keep_local_model


async def main(kv, ctx):
    args = arg_parser("cnn_fp16.py", ctx).parse_args(ctx.args)
    model = ctx.build_model()
    params = model.params
    half = [w.astype(np.float16) for w in params]
    for idx, h in enumerate(half):
        kv.init(idx, h)
        if not kv.is_master_worker:
            kv.pull(idx, out=h)
    await kv.waitall()
    for w, h in zip(params, half):
        w[...] = h  # set_data: back to fp32
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
            kv.push(k, g.astype(np.float16), priority=-k)
            kv.pull(k, out=half[k], priority=-k)
        await kv.waitall()
        for k, w in enumerate(params):
            opt.update(k, w, half[k].astype(np.float32), states[k])
        evaluate(ctx, model, data, it, loss)
