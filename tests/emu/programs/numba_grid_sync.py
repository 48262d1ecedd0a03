"""numba-cuda's grid-wide synchronization: a kernel calling `cuda.cg.this_grid().sync()` is
linked with libcudadevrt.a and launched cooperatively by numba; each block sums its part,
the grid meets, and every block then reads the total block 0 made of the partial sums."""

import numpy as np
from numba import cuda, int32


@cuda.jit
def grid_total(values, partial, total):
    grid = cuda.cg.this_grid()
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    mine = 0
    for i in range(start, values.size, stride):
        mine += values[i]
    cuda.atomic.add(partial, cuda.blockIdx.x, mine)
    grid.sync()
    if start == 0:
        s = 0
        for b in range(partial.size):
            s += partial[b]
        total[0] = s
    grid.sync()
    partial[cuda.blockIdx.x] = total[0]


values = (np.arange(5000, dtype=np.int32) * 37) % 101
blocks = 6
partial = cuda.to_device(np.zeros(blocks, np.int32))
total = cuda.to_device(np.zeros(1, np.int32))
kernel = grid_total[blocks, 64]
kernel(cuda.to_device(values), partial, total)
got = partial.copy_to_host()
assert (got == int32(values.sum())).all(), got
assert grid_total.overloads[list(grid_total.overloads)[0]].max_cooperative_grid_blocks(64) >= blocks
print(f"numba_grid_sync: {blocks} blocks met at grid.sync(), total {int(values.sum())} correct")
