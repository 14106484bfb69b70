"""PyTorch training scripts on geomx, with Horovod's and BytePS's names (docs/torch.md).

A script written for Horovod needs ``geomx.torch.init(kv, ctx)`` in place of
``hvd.init()``, one line that lets the master worker return after publishing the model,
and, in an ``async def main``, ``await`` before the calls that wait::

    import geomx.torch as hvd

    def main(kv, ctx):
        hvd.init(kv, ctx)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size())
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=hvd.Compression.fp16)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        if hvd.is_master():
            return
        for it in ctx.iterations():
            ...
            loss.backward()
            opt.step()
"""

from geomx.torch.broadcast import broadcast_optimizer_state, broadcast_parameters
from geomx.torch.compression import Compression
from geomx.torch.optimizer import DistributedOptimizer, server_optimizer_config
from geomx.torch.session import (TorchAPIError, init, is_master, local_rank, local_size,
                                 rank, size)

__all__ = ["Compression", "DistributedOptimizer", "TorchAPIError",
           "broadcast_optimizer_state", "broadcast_parameters", "init", "is_master",
           "local_rank", "local_size", "rank", "server_optimizer_config", "size"]
