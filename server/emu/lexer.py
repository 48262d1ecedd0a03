"""Splits PTX text into tokens that remember their line."""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import PtxError

__all__ = ["Token", "tokenize"]


class Token(NamedTuple):
    kind: str   # "word", "num", "fbits", "str", "punct"
    text: str
    line: int


_TOKEN_RE = re.compile(
    r"""
    (?P<space>[ \t\r\f\v]+)
  | (?P<newline>\n)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<str>"(?:\\.|[^"\\\n])*")
  | (?P<fbits>0[fF][0-9a-fA-F]{8}(?![0-9a-zA-Z_])|0[dD][0-9a-fA-F]{16}(?![0-9a-zA-Z_]))
  | (?P<num>0[xX][0-9a-fA-F]+U?|0[bB][01]+U?
            |\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+U?)
  | (?P<word>[A-Za-z_$%.][A-Za-z0-9_$.]*(?:::[A-Za-z0-9_$.]+)*)
  | (?P<punct>[,;:{}\[\]()+\-!@|<>=*])
    """,
    re.S | re.X,
)


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    line = 1
    pos = 0
    end = len(text)
    match = _TOKEN_RE.match
    while pos < end:
        m = match(text, pos)
        if m is None:
            raise PtxError(f"unexpected character {text[pos]!r}", line)
        kind = m.lastgroup
        value = m.group()
        if kind == "newline":
            line += 1
        elif kind == "comment":
            line += value.count("\n")
        elif kind == "word" and value[0] == "." and "." in value[1:]:
            # Directives may be written without spaces between their parts: ptxas accepts
            # `.reg.b16 h;`, which cuda_fp16.hpp and cuda_bf16.hpp emit.
            tokens.extend(Token(kind, "." + part, line) for part in value[1:].split("."))
        elif kind != "space":
            tokens.append(Token(kind, value, line))
        pos = m.end()
    return tokens
