"""C printf formatting for device-side printf (vprintf's format string and argument buffer).

vprintf receives a format string and a buffer in which the compiler stored each argument at
an offset aligned to its size: int-sized conversions take 4 bytes, `l`/`ll`/`z`/`j`/`t`
ones 8, floating conversions a double (8), `%s` and `%p` a 64-bit pointer.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable

__all__ = ["ArgumentBuffer", "DEFAULT_PRINTF_FIFO_BYTES", "PRINTF_RECORD_HEADER",
           "fifo_record_size", "format_printf", "within_fifo"]

# CU_LIMIT_PRINTF_FIFO_SIZE of a fresh context: 1 MiB, as CUDA's.
DEFAULT_PRINTF_FIFO_BYTES = 1 << 20
# The widest field (and the most digits) one conversion pads to.
MAX_FIELD = 1 << 16
# A printf call stores one record in the launch's FIFO: a header and the format string's
# address, then the argument buffer. CUDA's layout is undocumented; this model's records are
# 8 + 8 bytes plus the arguments rounded up to 8, within a few bytes of a GPU's, so about as
# many calls fit.
PRINTF_RECORD_HEADER = 16

_SPEC = re.compile(
    rb"%(?P<flags>[-+ #0]*)(?P<width>\*|\d+)?(?:\.(?P<precision>\*|\d*))?"
    rb"(?P<length>hh|h|ll|l|L|z|j|t|q)?(?P<conv>[diouxXeEfFgGaAcspn%])")


class ArgumentBuffer:
    """Reads successive arguments, each aligned to its own size, from a bytes buffer."""

    def __init__(self, data: bytes):
        self.data = data
        self.offset = 0

    def _take(self, size: int) -> bytes:
        self.offset = (self.offset + size - 1) // size * size
        chunk = self.data[self.offset:self.offset + size]
        self.offset += size
        return chunk.ljust(size, b"\0")

    def int32(self) -> int:
        return struct.unpack("<i", self._take(4))[0]

    def int64(self) -> int:
        return struct.unpack("<q", self._take(8))[0]

    def double(self) -> float:
        return struct.unpack("<d", self._take(8))[0]


def fifo_record_size(args: ArgumentBuffer) -> int:
    """Bytes of the printf FIFO the call that read `args` takes."""
    return PRINTF_RECORD_HEADER + (args.offset + 7) // 8 * 8


def within_fifo(records: list[tuple], fifo_bytes: int) -> list[tuple]:
    """The printf records (..., sequence number, FIFO bytes, text) that fit a FIFO of
    `fifo_bytes`, taken in the order the calls ran: once it is full, later output is
    dropped, as a GPU drops what no longer fits."""
    kept: list[tuple] = []
    used = 0
    for record in sorted(records, key=lambda r: r[-3]):
        used += record[-2]
        if used > fifo_bytes:
            break
        kept.append(record)
    return kept


def format_printf(fmt: bytes, args: ArgumentBuffer, read_string: Callable[[int], bytes]) -> str:
    """Format like C's printf; `read_string(address)` fetches a NUL-terminated string."""
    out: list[str] = []
    pos = 0
    for m in _SPEC.finditer(fmt):
        out.append(fmt[pos:m.start()].decode("utf-8", "replace"))
        pos = m.end()
        conv = m["conv"].decode()
        if conv == "%":
            out.append("%")
            continue
        flags = m["flags"].decode()
        width = m["width"].decode() if m["width"] else ""
        if width == "*":
            value = args.int32()
            if value < 0:
                flags += "-"
            width = str(abs(value))
        precision = m["precision"]
        if precision is not None:
            precision = precision.decode()
            if precision == "*":
                value = args.int32()
                precision = str(value) if value >= 0 else None
            elif precision == "":
                precision = "0"
        # A field pads to its width (and a number to its precision) before the FIFO bounds
        # the text: a width of 2**31 must not make gigabytes for one call.
        if width:
            width = str(min(int(width), MAX_FIELD))
        if precision is not None and conv != "s":
            precision = str(min(int(precision), MAX_FIELD))
        length = (m["length"] or b"").decode()
        out.append(_convert(conv, flags, width, precision, length, args, read_string))
    out.append(fmt[pos:].decode("utf-8", "replace"))
    return "".join(out)


def _convert(conv, flags, width, precision, length, args, read_string) -> str:
    spec = "%" + flags + width + ("." + precision if precision is not None else "")
    wide = length in ("l", "ll", "z", "j", "t", "q")
    if conv in "di":
        value = args.int64() if wide else args.int32()
        if length == "h":
            value = (value + 2**15) % 2**16 - 2**15
        elif length == "hh":
            value = (value + 2**7) % 2**8 - 2**7
        return (spec + "d") % value
    if conv in "ouxX":
        value = args.int64() if wide else args.int32()
        bits = 64 if wide else 16 if length == "h" else 8 if length == "hh" else 32
        value %= 2 ** bits
        text = (spec.replace("#", "") + conv.replace("u", "d")) % value
        if "#" in flags and value:
            prefix = {"o": "0", "x": "0x", "X": "0X"}.get(conv, "")
            text = _with_prefix(text, prefix, flags, width)
        return text
    if conv in "eEfFgGaA":
        value = args.double()
        if conv in "aA":
            text = float.hex(value)
            return (spec.replace("#", "") + "s") % (text.upper() if conv == "A" else text)
        return (spec + conv) % value
    if conv == "c":
        return (spec.replace("#", "") + "c") % chr(args.int32() & 0xFF)
    if conv == "s":
        address = args.int64() & 0xFFFF_FFFF_FFFF_FFFF
        text = "(null)" if address == 0 else read_string(address).decode("utf-8", "replace")
        return (spec.replace("#", "") + "s") % text
    if conv == "p":
        address = args.int64() & 0xFFFF_FFFF_FFFF_FFFF
        return ("%" + flags.replace("#", "") + width + "s") % (
            f"0x{address:x}" if address else "(nil)")
    args.int64()  # %n: nothing is written back
    return ""


def _with_prefix(text: str, prefix: str, flags: str, width: str) -> str:
    """C's '#' flag: a 0 / 0x / 0X prefix that counts toward the field width."""
    body = text.strip()
    if "0" in flags and "-" not in flags and width:
        digits = body.lstrip("0") or "0"
        return prefix + digits.rjust(int(width) - len(prefix), "0")
    full = prefix + body
    if "-" in flags:
        return full.ljust(int(width or 0))
    return full.rjust(int(width or 0))
