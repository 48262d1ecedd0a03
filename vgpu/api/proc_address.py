"""Which exported symbol `cuGetProcAddress` answers for a base name, a CUDA version and a flavour.

cudaTypedefs.h declares one `PFN_<base>_v<version>[_ptds|_ptsz]` typedef per exported symbol:
the version is the CUDA release at which that symbol became the answer for `<base>`. The
symbols of one base and flavour (`cuCtxCreate`, `cuCtxCreate_v2`, `_v3`, `_v4`) appeared in the
same order as those versions (3020, 11040, 12050 ...), so they pair up in order. The caller
checks that each pair has the same signature (see `pfn_name`), which catches a header that
breaks the pattern.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ProcAddressEntry", "split_symbol", "map_pfn_typedefs", "pfn_name"]

_PFN_NAME = re.compile(r"PFN_(\w+?)_v(\d+)(_ptds|_ptsz)?")
_SYMBOL_NAME = re.compile(r"(\w+?)(?:_v(\d+))?(_ptds|_ptsz)?")


@dataclass(frozen=True, slots=True, order=True)
class ProcAddressEntry:
    """`symbol` is the answer for `base` from CUDA `version` on, in the given stream flavour.

    `flavour` is "" for the legacy default stream, "_ptds" or "_ptsz" for the per-thread default
    stream variants (asked for with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM).
    """

    base: str
    version: int
    flavour: str
    symbol: str


def split_symbol(symbol: str) -> tuple[str, int, str]:
    """`cuMemcpyHtoD_v2_ptds` -> ("cuMemcpyHtoD", 2, "_ptds"); unversioned symbols are 1."""
    match = _SYMBOL_NAME.fullmatch(symbol)
    assert match is not None, symbol
    return match.group(1), int(match.group(2) or 1), match.group(3) or ""


def pfn_name(entry: ProcAddressEntry) -> str:
    """The cudaTypedefs.h typedef an entry comes from: `PFN_cuMemAlloc_v3020`."""
    return f"PFN_{entry.base}_v{entry.version}{entry.flavour}"


def map_pfn_typedefs(pfn_names: Iterable[str], symbols: Iterable[str]) -> list[ProcAddressEntry]:
    """Pairs each PFN typedef with the exported symbol it types."""
    versions: dict[tuple[str, str], list[int]] = {}
    for pfn in pfn_names:
        match = _PFN_NAME.fullmatch(pfn)
        if match is None:
            raise ValueError(f"unexpected typedef name {pfn}")
        key = (match.group(1), match.group(3) or "")
        versions.setdefault(key, []).append(int(match.group(2)))
    variants: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for symbol in symbols:
        base, number, flavour = split_symbol(symbol)
        variants.setdefault((base, flavour), []).append((number, symbol))
    if versions.keys() != variants.keys():
        raise ValueError("PFN typedefs and symbols disagree on (base, flavour): "
                         f"{sorted(versions.keys() ^ variants.keys())}")
    entries = []
    for key, numbers in versions.items():
        syms = variants[key]
        if len(numbers) != len(syms):
            raise ValueError(f"{key}: {len(numbers)} PFN typedefs for {len(syms)} symbols")
        for version, (_, symbol) in zip(sorted(numbers), sorted(syms), strict=True):
            entries.append(ProcAddressEntry(key[0], version, key[1], symbol))
    return sorted(entries)
