"""Data generated from NVIDIA's headers (see ../README.md): read it through vgpu.api.table."""
