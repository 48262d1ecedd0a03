"""Loading CuPy's big modules on the emulator: the PTX CuPy's wheel carries for CUB and
Thrust (cupy/cuda/cub and thrust extension modules, tens of MB of PTX, hundreds of kernels),
loaded whole (every function parsed and compiled) against loaded lazily (bodies split off,
scanned for the kernels' attributes) and then the first launch's compile of one kernel, as
CuPy's first cp.sort or reduction does. Same run, same PTX; prints a table.

    python benchmarks/bench_cupy_modules.py [--whole]   (--whole: also the whole loads, minutes)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import cupy

from vgpu.binary_check import ElfFile
from vgpu.fatbin import EntryKind, parse_fatbin
from vgpu.server.emu import PtxModule


def cupy_ptx() -> list[tuple[str, str]]:
    """(extension name, PTX text) for each PTX entry CuPy's CUB and Thrust modules carry."""
    folder = Path(cupy.__file__).parent / "cuda"
    found = []
    for name in ("cub", "thrust"):
        path = next(folder.glob(f"{name}.*.so"))
        with ElfFile.open(path) as elf:
            entries = parse_fatbin(elf.section_data(".nv_fatbin"))
        found += [(name, e.ptx_text()) for e in entries if e.kind == EntryKind.PTX]
    return found


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    whole = "--whole" in sys.argv
    print(f"{'module':<10} {'PTX MB':>7} {'kernels':>8} {'lazy load s':>12} "
          f"{'first kernel s':>15}" + (f" {'whole load s':>13} {'ratio':>7}" if whole else ""))
    for name, text in cupy_ptx():
        module, lazy = timed(lambda text=text: PtxModule.parse(text, lazy=True))
        kernel = max(module.kernels)  # any one; they are template instances alike
        _, first = timed(lambda m=module, k=kernel: m.program.kernel(k))
        row = f"{name:<10} {len(text) / 1e6:>7.1f} {len(module.kernels):>8} {lazy:>12.2f} " \
              f"{first:>15.2f}"
        if whole:
            _, eager = timed(lambda text=text: PtxModule.parse(text, lazy=False))
            row += f" {eager:>13.1f} {eager / lazy:>6.0f}x"
        print(row)


if __name__ == "__main__":
    main()
