"""Where each element of a warp's fragment sits in its matrix: (row, column) per lane and
element.

mma.sync uses the layouts the PTX ISA specifies ("Matrix fragments for mma.m*n*k*"): with
groupID = laneid / 4, threadID_in_group = laneid % 4, p elements per 32-bit register and
element i of register r (i = r * p + j):

- A (M x K): row = groupID + 8 * (r % 2), col = p * threadID_in_group + j + 4p * (r / 2)
- B (K x N): row = p * threadID_in_group + j + 4p * r, col = groupID
- C, D (M x N), two elements per row pair: row = groupID + 8 * (i / 2),
  col = 2 * threadID_in_group + i % 2

One formula covers every shape of PTX ISA 7.x/8.0 (m8n8k4 f64, m8n8k16 s8, m8n8k32 s4,
m8n8k128 b1, m16n8k4/k8 tf32, m16n8k8/k16 f16 and bf16, m16n8k16/k32 s8, m16n8k32/k64 s4,
m16n8k128/k256 b1): an m8 shape has one A register and two C elements, so its rows stay
below 8.

wmma fragments are opaque: the PTX ISA leaves their distribution over the lanes to the
implementation, only fixing how many registers each lane holds. Here lane l's element i is
element (l * E + i) mod (rows * cols) of the matrix in row-major order (E elements per
lane). A/B fragments of f16 hold each element twice or more; copies stay equal because
loads fill them all and element-wise code treats them alike.
"""

from __future__ import annotations

import numpy as np

__all__ = ["mma_layout", "wmma_layout"]

_LANES = np.arange(32)[:, None]


def mma_layout(operand: str, per_register: int, elements: int):
    """(rows, cols) index arrays, each (32, elements), of an mma.sync operand 'a', 'b' or
    'c' (C and D share theirs)."""
    i = np.arange(elements)[None, :]
    group, thread = _LANES // 4, _LANES % 4
    p = per_register
    r, j = i // p, i % p
    if operand == "a":
        rows, cols = group + 8 * (r % 2), p * thread + j + 4 * p * (r // 2)
    elif operand == "b":
        rows, cols = p * thread + j + 4 * p * r, group
    else:
        rows, cols = group + 8 * (i // 2), 2 * thread + i % 2
    return np.broadcast_to(rows, (32, elements)), np.broadcast_to(cols, (32, elements))


def wmma_layout(rows: int, cols: int, elements: int):
    """(rows, cols) index arrays, each (32, elements), of the emulator's wmma fragments."""
    linear = (_LANES * elements + np.arange(elements)[None, :]) % (rows * cols)
    return linear // cols, linear % cols
