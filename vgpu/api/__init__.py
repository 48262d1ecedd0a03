"""The declarative API table and what is generated from NVIDIA's headers.

- `cudadefs`: the driver API's enums (IntEnum, each made on first use: `lazy_enums`) and
  integer constants, plus CURESULT_DOC.
- `table`: every exported function (symbol, base name, typed parameters) and the
  cuGetProcAddress map, read from the generated data in `generated/`.
- `gen_driver_table` (dev-time, needs the CUDA toolkit headers and gcc): regenerates the
  above and the shim's C declarations and stubs. See README.md in this directory.
"""
