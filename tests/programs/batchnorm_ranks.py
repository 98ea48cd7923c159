"""Float32 batch norm of inputs far from zero on the ranks of the job, uneven shares:
``mpiexec -n P python batchnorm_ranks.py OUT.npz``.

24 samples near 1e4, shared 4/8/12 on 3 ranks (all on 1). Two training steps (the second
uses the running mean as its shift); rank 0 writes the whole batch's outputs and input
gradients, and the running statistics.
"""
import sys

import numpy as np

from pydtnn_lite.backend import make_backend
from pydtnn_lite.comm.mpi import MPICommunicator
from pydtnn_lite.layers import BatchNorm, StepContext

SHARES = {1: [0, 24], 3: [0, 4, 12, 24]}


def main() -> None:
    comm = MPICommunicator()
    bounds = SHARES[comm.size]
    rows = slice(bounds[comm.rank], bounds[comm.rank + 1])
    rng = np.random.default_rng(7)
    x = (1e4 + rng.normal(size=(24, 4, 4, 3))).astype(np.float32)
    grad = rng.normal(size=x.shape).astype(np.float32)
    bn = BatchNorm()
    bn.build([(4, 4, 3)], make_backend("cpu", "float32"), np.random.default_rng(0))
    ctx = StepContext(training=True, global_batch=24, sample_offset=rows.start, sum_across_ranks=comm.allreduce)
    outputs, grads = [], []
    for _ in range(2):
        outputs.append(bn.forward(x[rows], ctx=ctx))
        grads.append(bn.backward(grad[rows]))
    gathered = comm.gather_object((outputs, grads))
    if comm.rank == 0:
        np.savez(sys.argv[1], outputs=np.concatenate([np.stack(o) for o, _ in gathered], axis=1),
                 grads=np.concatenate([np.stack(g) for _, g in gathered], axis=1),
                 running_mean=bn.buffers["running_mean"], running_var=bn.buffers["running_var"])


if __name__ == "__main__":
    main()
