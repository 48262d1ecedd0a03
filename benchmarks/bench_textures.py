"""Texture fetches on the PTX emulator; prints a table.

    python benchmarks/bench_textures.py

A 512x512 float image sampled once per thread with bilinear filtering (tex2D through a
texture object), against the same kernel shape reading the image with one plain load per
thread, same run: the ratio is what a texture fetch costs the emulator over a load.
"""

from __future__ import annotations

import struct

import numpy as np
from bench_emu import Device, compile_ptx, timed

from vgpu.server.emu import PtxModule, launch
from vgpu.texture_objects import TEXTURE_MAGIC, ChannelKind, Descriptor

SOURCE = r"""
extern "C" __global__ void sampled(cudaTextureObject_t t, float *out, int w) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    out[y * w + x] = tex2D<float>(t, x + 0.25f, y + 0.75f);
}
extern "C" __global__ void loaded(const float *image, float *out, int w) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    out[y * w + x] = image[y * w + x];
}
"""
SIZE = 512


def main() -> None:
    module = PtxModule.parse(compile_ptx(SOURCE))
    dev = Device()
    image = np.random.rand(SIZE, SIZE).astype(np.float32)
    pixels = dev.upload(image)
    out = dev.upload(np.zeros_like(image))
    descriptor = Descriptor(TEXTURE_MAGIC, pixels, 2, False, SIZE, SIZE, 1, 1, SIZE * 4,
                            SIZE * SIZE * 4, ChannelKind.FLOAT, 32, 1, linear_filter=True)
    texture = dev.upload(np.frombuffer(descriptor.pack(), np.uint8))
    grid, block = (SIZE // 256, SIZE), (256,)

    def run(kernel: str, source: int) -> float:
        params = struct.pack("<QQi", source, out, SIZE)
        return timed(lambda: launch(module, kernel, grid, block, params=params,
                                    memory=dev.memory), 5)

    fetch = run("sampled", texture)
    load = run("loaded", pixels)
    threads = SIZE * SIZE
    print("| benchmark | result | ratio to baseline |")
    print("|---|---|---|")
    print(f"| plain loads, {SIZE}x{SIZE} threads (baseline) | {load * 1e3:.1f} ms, "
          f"{threads / load / 1e6:.1f} M loads/s | 1 |")
    print(f"| bilinear tex2D fetches, {SIZE}x{SIZE} threads | {fetch * 1e3:.1f} ms, "
          f"{threads / fetch / 1e6:.1f} M fetches/s | {load / fetch:.3f} |")


if __name__ == "__main__":
    main()
