"""The memory checker's policy for stray global accesses, and its report.

A stray access lies inside an allocation's mapped granule (see memory.py) but past the end
of the allocation: a GPU carries it out without a fault, a memory checker reports it. Strict
checking (VGPU_MEMCHECK=strict) makes it CUDA_ERROR_ILLEGAL_ADDRESS instead, as an access
outside every granule always is. Reports come once per kernel for the checker's lifetime (the
emu backend keeps one per session), so a loop of launches does not flood stderr.
"""

from __future__ import annotations

__all__ = ["MemoryChecker", "REPORT_PREFIX"]

# What starts every report line on the application's stderr.
REPORT_PREFIX = "vgpu memcheck: "


class MemoryChecker:
    def __init__(self, strict: bool = False):
        self.strict = strict
        self._reported: set[str] = set()

    def should_report(self, kernel_name: str) -> bool:
        """Is the next stray access of this kernel to be reported (else carried out quietly)?"""
        return kernel_name not in self._reported

    def report(self, kernel_name: str, message: str) -> str:
        """The report of a kernel's first stray access, as its lines go to stderr."""
        self._reported.add(kernel_name)
        return (f"{REPORT_PREFIX}{message}\n"
                f"{REPORT_PREFIX}  the memory is mapped, so on a GPU the access goes through "
                f"without a fault, as it did here (VGPU_MEMCHECK=strict makes it "
                f"CUDA_ERROR_ILLEGAL_ADDRESS); reported once per kernel\n")
