"""Splits PTX text into tokens that remember their line."""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import PtxError

__all__ = ["Token", "tokenize"]


class Token(NamedTuple):
    kind: str   # "word", "num", "fbits", "str", "punct"; "body", "ints" (see tokenize)
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


# A flat initializer of decimal integers (`= {202, 29, 180}`): curand's tables in CuPy's
# modules hold hundreds of thousands of them.
_INTEGER_LIST_RE = re.compile(r"\{[0-9,\s]*\}")
# What a body's end is found by: braces, and the comments and strings that may hold some.
# (Starting with a character set lets the regex engine skip the text between quickly.)
_BRACES_RE = re.compile(r"""[{}/"](?:(?<=/)(?:/[^\n]*|\*.*?\*/)|(?<=")(?:\\.|[^"\\\n])*")?""",
                        re.S)


def tokenize(text: str, line: int = 1, bodies: bool = False) -> list[Token]:
    """The tokens of `text`, whose first line is `line`. A flat list of decimal integers
    after `=` is one "ints" token, its text from `{` to `}`. With `bodies`, each function body
    (a `{` at module level that does not open an initializer or a .section) becomes one
    "body" token holding its text from `{` to `}`, unsplit: a module's bodies can then be
    tokenized one by one, when needed."""
    tokens: list[Token] = []
    pos = 0
    end = len(text)
    match = _TOKEN_RE.match
    depth = 0  # module-level braces open (initializers, sections) when finding bodies
    while pos < end:
        m = match(text, pos)
        if m is None:
            raise PtxError(f"unexpected character {text[pos]!r}", line)
        kind = m.lastgroup
        value = m.group()
        if value == "{" and tokens and tokens[-1].text == "=":
            integers = _INTEGER_LIST_RE.match(text, pos)
            if integers is not None:
                tokens.append(Token("ints", integers.group(), line))
                line += integers.group().count("\n")
                pos = integers.end()
                continue
        if bodies and kind == "punct" and value in "{}":
            if value == "{" and depth == 0 and _opens_body(tokens):
                body_end = _matching_brace(text, pos, line)
                body = text[pos:body_end]
                tokens.append(Token("body", body, line))
                line += body.count("\n")
                pos = body_end
                continue
            depth += 1 if value == "{" else -1
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


def _opens_body(tokens: list[Token]) -> bool:
    """Is a `{` at module level, after these tokens, a function body? Otherwise it opens
    an initializer (`= {`) or a `.section NAME {`."""
    if not tokens or tokens[-1].text == "=":
        return False
    return not (len(tokens) >= 2 and tokens[-2].text == ".section")


def _matching_brace(text: str, start: int, line: int) -> int:
    """Where the `{` at `start` is closed (the index after its `}`)."""
    depth = 0
    for m in _BRACES_RE.finditer(text, start):
        value = m.group()
        if value == "{":
            depth += 1
        elif value == "}":
            depth -= 1
            if depth == 0:
                return m.end()
    raise PtxError("unexpected end of module: a function body is not closed", line)
