"""A warp-wide instruction's view of the lanes executing it: the warps they belong to, each
lane's registers gathered per warp, and results scattered back to the executing lanes.

Tensor-core instructions (`.sync.aligned`) need all 32 threads of the warp; a thread that
is not executing (diverged) has its registers read as they are, as `shfl` reads them, and
gets no result. Lanes beyond the end of a block's short last warp read as its lane 0 (a GPU
leaves such a launch undefined).
"""

from __future__ import annotations

import numpy as np

__all__ = ["WarpLanes"]

_LANE = np.arange(32)


class WarpLanes:
    def __init__(self, state, lanes):
        ids = state.lane_ids(lanes)
        layout = state.layout
        self.warps, self.position = np.unique(layout.warp_first[ids], return_inverse=True)
        self.lane = layout.laneid[ids].astype(np.intp)
        size = layout.warp_size[self.warps]
        self.members = np.where(_LANE[None, :] < size[:, None],
                                self.warps[:, None] + _LANE[None, :], self.warps[:, None])

    @property
    def count(self) -> int:
        return len(self.warps)

    def gather(self, state, reads) -> np.ndarray:
        """(warps, 32, len(reads)): each register reader's value in every lane of each warp."""
        columns = [np.broadcast_to(read(state, None), (state.n,))[self.members]
                   for read in reads]
        return np.stack(columns, axis=-1)

    def scatter(self, state, lanes, writes, values: np.ndarray) -> None:
        """Write `values` (warps, 32, len(writes)) to the executing lanes' registers."""
        mine = values[self.position, self.lane]
        for r, write in enumerate(writes):
            write(state, lanes, np.ascontiguousarray(mine[:, r]))
