"""Texture fetches and surface accesses in the emulator, against sampling computed on the
host. Objects are descriptors in device memory (vgpu/texture_objects.py), as the driver shim
writes them."""

from __future__ import annotations

import numpy as np
import pytest

from vgpu.server.emu import LaunchError
from vgpu.texture_objects import (
    ADDRESS_BORDER,
    ADDRESS_CLAMP,
    ADDRESS_MIRROR,
    ADDRESS_WRAP,
    DESCRIPTOR_SIZE,
    LEVEL,
    SURFACE_MAGIC,
    TEXTURE_MAGIC,
    ChannelKind,
    Descriptor,
)

SOURCE = r"""
extern "C" __global__ void fetch2d(cudaTextureObject_t t, const float *x, const float *y,
                                   float4 *out, int n) {
    int i = threadIdx.x + blockIdx.x * blockDim.x;
    if (i < n) out[i] = tex2D<float4>(t, x[i], y[i]);
}
extern "C" __global__ void fetch1d_int(cudaTextureObject_t t, const int *x, float4 *out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<float4>(t, x[i]);
}
extern "C" __global__ void fetch3d(cudaTextureObject_t t, const float *x, const float *y,
                                   const float *z, uchar4 *out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = tex3D<uchar4>(t, x[i], y[i], z[i]);
}
extern "C" __global__ void fetch_layered(cudaTextureObject_t t, const float *x, const float *y,
                                         const int *layer, float *out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = tex2DLayered<float>(t, x[i], y[i], layer[i]);
}
extern "C" __global__ void double_surface(cudaSurfaceObject_t s, int width, int height) {
    int x = threadIdx.x, y = blockIdx.x;
    if (x < width && y < height) {
        float v;
        surf2Dread(&v, s, x * 4, y);
        surf2Dwrite(v * 2, s, x * 4, y);
    }
}
extern "C" __global__ void surface_edges(cudaSurfaceObject_t s, const int *x, float *out, int n) {
    int i = threadIdx.x;
    if (i < n) {
        out[i] = surf1Dread<float>(s, x[i] * 4, cudaBoundaryModeZero);
        surf1Dwrite(-1.0f, s, x[i] * 4, cudaBoundaryModeZero);
    }
}
extern "C" __global__ void gather(cudaTextureObject_t t, float x, float y, float4 *out) {
    out[0] = tex2Dgather<float4>(t, x, y, 0);
    out[1] = tex2Dgather<float4>(t, x, y, 2);
}
extern "C" __global__ void queries(cudaTextureObject_t t, cudaSurfaceObject_t s, int *out) {
    asm("txq.width.b32 %0, [%1];" : "=r"(out[0]) : "l"(t));
    asm("txq.height.b32 %0, [%1];" : "=r"(out[1]) : "l"(t));
    asm("txq.normalized_coords.b32 %0, [%1];" : "=r"(out[2]) : "l"(t));
    asm("txq.addr_mode_1.b32 %0, [%1];" : "=r"(out[3]) : "l"(t));
    asm("suq.width.b32 %0, [%1];" : "=r"(out[4]) : "l"(s));
    asm("suq.array_size.b32 %0, [%1];" : "=r"(out[5]) : "l"(s));
}
extern "C" __global__ void gradients(cudaTextureObject_t t, const float *g, float *out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = tex2DGrad<float>(t, 0.3f, 0.6f, make_float2(g[i], 0.f),
                                         make_float2(0.f, g[i] / 2));
}
extern "C" __global__ void surface_trap(cudaSurfaceObject_t s, int x, float *out) {
    surf1Dread(out, s, x * 4);
}
"""


@pytest.fixture(scope="module")
def texture_ptx(toolkit) -> str:
    return toolkit.ptx(SOURCE)


def _object(device, magic, data: np.ndarray, dims: int, channels: int, kind: int, *,
            layers: int = 1, **sampling) -> int:
    """Uploads texels (shape [layers or depth][height][width][channels]) and a descriptor;
    the object's handle."""
    shape = data.shape
    width = shape[-2]
    height = shape[-3] if dims >= 2 or layers > 1 and len(shape) >= 3 else 1
    depth = shape[0] if dims == 3 else 1
    base = device.upload(data)
    texel = data.dtype.itemsize * channels
    descriptor = Descriptor(magic, base, dims, layers > 1, width, height, depth, layers,
                            width * texel, width * height * texel, kind,
                            data.dtype.itemsize * 8, channels, **sampling)
    return device.upload(np.frombuffer(descriptor.pack(), np.uint8))


def _points(device, *columns):
    return [device.upload(np.asarray(c)) for c in columns]


def _host_linear_2d(image: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """CUDA's bilinear filtering with clamped addressing (weights exact for these points)."""
    h, w = image.shape[:2]
    x0, y0 = np.floor(x - 0.5).astype(int), np.floor(y - 0.5).astype(int)
    a, b = x - 0.5 - x0, y - 0.5 - y0

    def at(yy, xx):
        return image[np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)]
    return ((1 - a)[:, None] * (1 - b)[:, None] * at(y0, x0) + a[:, None] * (1 - b)[:, None]
            * at(y0, x0 + 1) + (1 - a)[:, None] * b[:, None] * at(y0 + 1, x0)
            + a[:, None] * b[:, None] * at(y0 + 1, x0 + 1))


def test_2d_point_and_linear_sampling_of_float4_texels(device, texture_ptx):
    module = device.load(texture_ptx)
    image = np.arange(5 * 7 * 4, dtype=np.float32).reshape(5, 7, 4)
    x = np.array([0.5, 3.25, 6.99, -4.0, 10.0, 2.0, 0.75, 6.5], np.float32)
    y = np.array([0.5, 1.75, 4.5, 2.0, -1.0, 2.5, 4.25, 0.0], np.float32)
    dx, dy = _points(device, x, y)
    out = device.zeros(len(x) * 4, np.float32)
    point = _object(device, TEXTURE_MAGIC, image, 2, 4, ChannelKind.FLOAT)
    device.launch(module, "fetch2d", (1,), (32,), point, dx, dy, out, len(x))
    expected = image[np.clip(np.floor(y).astype(int), 0, 4), np.clip(np.floor(x).astype(int),
                                                                      0, 6)]
    np.testing.assert_array_equal(device.download(out, len(x) * 4, np.float32).reshape(-1, 4),
                                  expected)
    linear = _object(device, TEXTURE_MAGIC, image, 2, 4, ChannelKind.FLOAT, linear_filter=True)
    device.launch(module, "fetch2d", (1,), (32,), linear, dx, dy, out, len(x))
    np.testing.assert_allclose(device.download(out, len(x) * 4, np.float32).reshape(-1, 4),
                               _host_linear_2d(image.astype(np.float64), x, y), rtol=1e-6)


@pytest.mark.parametrize("mode", [ADDRESS_WRAP, ADDRESS_MIRROR, ADDRESS_BORDER, ADDRESS_CLAMP])
def test_normalized_coordinates_address_modes_and_normalized_unsigned_bytes(device,
                                                                            texture_ptx, mode):
    module = device.load(texture_ptx)
    width, height = 4, 2
    image = (np.arange(height * width * 4) * 7 % 256).astype(np.uint8).reshape(height, width,
                                                                                  4)
    x = np.array([0.1, 0.9, 1.1, -0.1, 1.9, -1.3, 2.6], np.float32)
    y = np.full(len(x), 0.25, np.float32)  # row 0
    dx, dy = _points(device, x, y)
    out = device.zeros(len(x) * 4, np.float32)
    border = (0.5, 0.25, 0.125, 1.0)
    handle = _object(device, TEXTURE_MAGIC, image, 2, 4, ChannelKind.UNSIGNED,
                     normalized_coords=True, address_modes=(mode, mode, mode), border=border)
    device.launch(module, "fetch2d", (1,), (32,), handle, dx, dy, out, len(x))
    index = np.floor(x.astype(np.float64) * width).astype(int)
    if mode == ADDRESS_WRAP:
        index = index % width
    elif mode == ADDRESS_MIRROR:
        folded = index % (2 * width)
        index = np.where(folded < width, folded, 2 * width - 1 - folded)
    expected = image[0, np.clip(index, 0, width - 1)] / 255.0
    if mode == ADDRESS_BORDER:
        expected[(index < 0) | (index >= width)] = border
    np.testing.assert_allclose(device.download(out, len(x) * 4, np.float32).reshape(-1, 4),
                               expected, rtol=1e-6)


def test_integer_fetch_of_a_one_channel_texture_fills_the_missing_channels(device,
                                                                          texture_ptx):
    module = device.load(texture_ptx)
    data = np.linspace(-1, 1, 10, dtype=np.float32).reshape(1, 10, 1)
    handle = _object(device, TEXTURE_MAGIC, data, 1, 1, ChannelKind.FLOAT)
    x = np.array([0, 3, 9, 12, -2], np.int32)
    (dx,) = _points(device, x)
    out = device.zeros(len(x) * 4, np.float32)
    device.launch(module, "fetch1d_int", (1,), (32,), handle, dx, out, len(x))
    expected = np.zeros((len(x), 4), np.float32)
    expected[:, 0] = data[0, np.clip(x, 0, 9), 0]
    expected[:, 3] = 1.0
    np.testing.assert_array_equal(device.download(out, len(x) * 4, np.float32).reshape(-1, 4),
                                  expected)


def test_signed_bytes_read_as_normalized_floats_in_minus_one_to_one(device, texture_ptx):
    module = device.load(texture_ptx)
    data = np.array([-128, -127, -1, 0, 1, 127], np.int8).reshape(1, 6, 1)
    handle = _object(device, TEXTURE_MAGIC, data, 1, 1, ChannelKind.SIGNED)
    (dx,) = _points(device, np.arange(6, dtype=np.int32))
    out = device.zeros(6 * 4, np.float32)
    device.launch(module, "fetch1d_int", (1,), (32,), handle, dx, out, 6)
    np.testing.assert_array_equal(device.download(out, 24, np.float32).reshape(-1, 4)[:, 0],
                                  np.float32([-1, -1, -1 / 127, 0, 1 / 127, 1]))


def test_3d_element_reads_and_layered_2d(device, texture_ptx):
    module = device.load(texture_ptx)
    volume = (np.arange(3 * 4 * 5 * 4) % 251).astype(np.uint8).reshape(3, 4, 5, 4)
    handle = _object(device, TEXTURE_MAGIC, volume, 3, 4, ChannelKind.UNSIGNED,
                     read_as_integer=True)
    x = np.array([0.5, 4.5, 2.2, 9.0], np.float32)
    y = np.array([0.5, 3.9, 1.0, 1.0], np.float32)
    z = np.array([0.5, 2.5, 1.7, -3.0], np.float32)
    dx, dy, dz = _points(device, x, y, z)
    out = device.zeros(len(x) * 4, np.uint8)
    device.launch(module, "fetch3d", (1,), (32,), handle, dx, dy, dz, out, len(x))
    expected = volume[np.clip(np.floor(z).astype(int), 0, 2), np.clip(np.floor(y).astype(int),
                      0, 3), np.clip(np.floor(x).astype(int), 0, 4)]
    np.testing.assert_array_equal(device.download(out, len(x) * 4, np.uint8).reshape(-1, 4),
                                  expected)

    layers = np.arange(3 * 2 * 3, dtype=np.float32).reshape(3, 2, 3, 1)
    handle = _object(device, TEXTURE_MAGIC, layers, 2, 1, ChannelKind.FLOAT, layers=3)
    layer = np.array([0, 1, 2, 5], np.int32)
    dx, dy, dl = _points(device, np.array([0.5, 1.5, 2.5, 0.5], np.float32),
                         np.array([0.5, 1.5, 0.5, 1.5], np.float32), layer)
    out = device.zeros(4, np.float32)
    device.launch(module, "fetch_layered", (1,), (32,), handle, dx, dy, dl, out, 4)
    np.testing.assert_array_equal(device.download(out, 4, np.float32),
                                  [layers[0, 0, 0, 0], layers[1, 1, 1, 0], layers[2, 0, 2, 0],
                                   layers[2, 1, 0, 0]])


def test_surface_reads_and_writes(device, texture_ptx):
    module = device.load(texture_ptx)
    image = np.arange(3 * 6, dtype=np.float32).reshape(3, 6, 1)
    handle = _object(device, SURFACE_MAGIC, image, 2, 1, ChannelKind.FLOAT)
    texels = Descriptor.unpack(device.memory.read(handle, DESCRIPTOR_SIZE)).base
    device.launch(module, "double_surface", (3,), (8,), handle, 6, 3)
    np.testing.assert_array_equal(device.download(texels, 18, np.float32), image.ravel() * 2)

    row = np.arange(4, dtype=np.float32).reshape(1, 4, 1)
    handle = _object(device, SURFACE_MAGIC, row, 1, 1, ChannelKind.FLOAT)
    texels = Descriptor.unpack(device.memory.read(handle, DESCRIPTOR_SIZE)).base
    x = np.array([1, 4, -1, 3], np.int32)
    (dx,) = _points(device, x)
    out = device.zeros(4, np.float32)
    device.launch(module, "surface_edges", (1,), (32,), handle, dx, out, 4)
    np.testing.assert_array_equal(device.download(out, 4, np.float32), [1, 0, 0, 3])
    np.testing.assert_array_equal(device.download(texels, 4, np.float32), [0, -1, 2, -1])
    with pytest.raises(LaunchError) as failure:
        device.launch(module, "surface_trap", (1,), (1,), handle, 4, out)
    assert failure.value.code == 700
    assert "outside the surface" in str(failure.value)


def test_a_handle_that_is_no_texture_object_faults(device, texture_ptx):
    module = device.load(texture_ptx)
    not_an_object = device.upload(np.zeros(32, np.float32))
    x = device.upload(np.zeros(1, np.int32))
    with pytest.raises(LaunchError) as failure:
        device.launch(module, "fetch1d_int", (1,), (1,), not_an_object, x,
                      device.zeros(4, np.float32), 1)
    assert failure.value.code == 700
    assert "not a live texture object" in str(failure.value)


def test_gather_returns_one_component_of_the_bilinear_footprint(device, texture_ptx):
    module = device.load(texture_ptx)
    image = np.arange(4 * 5 * 4, dtype=np.float32).reshape(4, 5, 4)
    handle = _object(device, TEXTURE_MAGIC, image, 2, 4, ChannelKind.FLOAT)
    out = device.zeros(8, np.float32)
    device.launch(module, "gather", (1,), (1,), handle, np.float32(2.25), np.float32(1.75),
                  out)
    got = device.download(out, 8, np.float32).reshape(2, 4)
    x0, y0 = 1, 1  # floor(2.25 - 0.5), floor(1.75 - 0.5)
    corners = [(x0, y0 + 1), (x0 + 1, y0 + 1), (x0 + 1, y0), (x0, y0)]
    for row, channel in enumerate((0, 2)):
        np.testing.assert_array_equal(got[row], [image[y, x, channel] for x, y in corners])


def test_texture_and_surface_queries(device, texture_ptx):
    module = device.load(texture_ptx)
    texture = _object(device, TEXTURE_MAGIC, np.zeros((3, 7, 1), np.float32), 2, 1,
                      ChannelKind.FLOAT, normalized_coords=True,
                      address_modes=(ADDRESS_CLAMP, ADDRESS_MIRROR, ADDRESS_WRAP))
    surface = _object(device, SURFACE_MAGIC, np.zeros((4, 1, 9, 2), np.int16), 1, 2,
                      ChannelKind.SIGNED, layers=4)
    out = device.zeros(6, np.int32)
    device.launch(module, "queries", (1,), (1,), texture, surface, out)
    np.testing.assert_array_equal(device.download(out, 6, np.int32),
                                  [7, 3, 1, ADDRESS_MIRROR, 9, 4])


def test_gradients_pick_the_mipmap_level(device, texture_ptx):
    """tex2DGrad samples level log2(the longer gradient in texels) of a mipmapped texture."""
    module = device.load(texture_ptx)
    levels = [np.full((8 >> k, 8 >> k, 1), 10.0 * (k + 1), np.float32) for k in range(4)]
    records = b"".join(LEVEL.pack(device.upload(level), level.shape[1] * 4,
                                  level.nbytes, level.shape[1], level.shape[0], 1)
                       for level in levels)
    table = device.upload(np.frombuffer(records, np.uint8))
    first = LEVEL.unpack_from(records)[0]
    descriptor = Descriptor(TEXTURE_MAGIC, first, 2, False, 8, 8, 1, 1, 32, 256,
                            ChannelKind.FLOAT, 32, 1, normalized_coords=True,
                            level_table=table, levels=4, max_level=3.0)
    handle = device.upload(np.frombuffer(descriptor.pack(), np.uint8))
    # gradients of 1/8, 1/4, 1/2, 1 and 4 of the texture: 1, 2, 4, 8, 32 texels
    g = np.array([0.125, 0.25, 0.5, 1.0, 4.0], np.float32)
    (dg,) = _points(device, g)
    out = device.zeros(len(g), np.float32)
    device.launch(module, "gradients", (1,), (32,), handle, dg, out, len(g))
    np.testing.assert_array_equal(device.download(out, len(g), np.float32),
                                  [10.0, 20.0, 30.0, 40.0, 40.0])
