"""A training program for any ``[sync] algorithm``, written only against geomx's program
API (``async def main(kv, ctx)``, docs/guide.md): the feature-pair sweep
(``tools/feature_pairs.py``) runs it as its "training program" setting.

Where ``examples/cnn.py`` is GeoMX's gradient loop for a global optimizer (FSA,
MixedSync), this one hands each step to ``ctx.worker_sync``, the same per-step policy
the built-in trainer uses: a gradient push under FSA and MixedSync, local steps and a
model average under HFA, budgeted local steps under ESync.
"""

from __future__ import annotations


async def main(kv, ctx):
    model = ctx.build_model()
    params = model.params
    if kv.is_master_worker and ctx.optimizer_config is not None:
        kv.set_optimizer(ctx.optimizer_config)
    kv.init(list(range(len(params))), params)
    if kv.is_master_worker:
        await kv.waitall()
        return
    for k, p in enumerate(params):
        kv.pull(k, out=p)
    await kv.waitall()
    sync = ctx.worker_sync(kv, params)
    data = ctx.dataset()
    batches = ctx.batches()
    for it in ctx.iterations():
        idx = batches.next()
        loss, grads = model.loss_and_grads(data.x_train[idx], data.y_train[idx])
        kv.report_loss(loss)
        await ctx.compute("per_iter")
        shared = await sync.step(it, grads)
        if ctx.is_evaluator and shared and (it % ctx.eval_every == 0 or it == ctx.max_iterations):
            ctx.report(it, loss=loss, accuracy=model.accuracy(data.x_test, data.y_test))
