"""vgpu: run unmodified CUDA applications on a GPU their process does not own.

Packages: `vgpu` (API table, protocol, client, CLI), `vgpu.shim` (the libcuda/libcudart
shims and the driver and runtime APIs in Python), `vgpu.server` (sessions, backends, the PTX
emulator), `vgpu.replay` (journal, checkpoint and replay; to come). See README.md.
"""
