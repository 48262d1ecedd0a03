"""PTX text -> `ir.Module`: the syntax of modules as nvcc, NVRTC and NVVM (numba) emit them.

Only syntax is checked here; whether an instruction and its modifiers are supported is
decided when the module is compiled (see `module.py`).

`parse_module(text, lazy=True)` leaves function bodies unparsed (`Function.pending`): a
scan of each body's text finds what its kernel's attributes need (declared registers and
variables, the functions it calls, the module-scope names it mentions) without parsing
its instructions, and `parse_body` parses one when it is to run. CuPy's CUB modules hold
thousands of functions, of which a program runs a few.
"""

from __future__ import annotations

import re
import struct

import numpy as np

from .errors import PtxError
from .ir import (
    Address,
    Function,
    Immediate,
    Instruction,
    ListOperand,
    Module,
    Operand,
    Register,
    RegisterOperand,
    Sink,
    SpecialRegister,
    Symbol,
    Variable,
    Vector,
)
from .lexer import Token, tokenize
from .ptx_types import PtxType, lookup_type

__all__ = ["SPECIAL_REGISTERS", "parse_body", "parse_module", "referenced_symbols"]

_XYZ = ("x", "y", "z")
SPECIAL_REGISTERS = frozenset(
    [f"%{base}.{c}" for base in ("tid", "ntid", "ctaid", "nctaid") for c in _XYZ]
    + [f"%{base}" for base in ("tid", "ntid", "ctaid", "nctaid")]
    + ["%laneid", "%warpid", "%nwarpid", "%smid", "%nsmid", "%gridid", "%clock",
       "%clock_hi", "%clock64", "%globaltimer", "%globaltimer_lo", "%globaltimer_hi",
       "%lanemask_eq", "%lanemask_lt", "%lanemask_le", "%lanemask_gt", "%lanemask_ge",
       "%dynamic_smem_size", "%total_smem_size", "%aggr_smem_size", "%reserved_smem_offset_begin",
       "%is_explicit_cluster", "%cluster_nctarank", "%cluster_ctarank", "%current_graph_exec"]
    + [f"%envreg{i}" for i in range(32)]
    + [f"%pm{i}" for i in range(8)] + [f"%pm{i}_64" for i in range(8)]
    + [f"%{base}.{c}" for base in ("clusterid", "nclusterid", "cluster_ctaid",
                                   "cluster_nctaid") for c in _XYZ]
)

_SPACES = {".global": "global", ".const": "const", ".shared": "shared", ".local": "local",
           ".param": "param"}
_LINKAGE = {".visible": "visible", ".extern": "extern", ".weak": "weak", ".common": "common"}
_FUNCTION_DIRECTIVES = {".maxntid", ".reqntid", ".minnctapersm", ".maxnctapersm", ".maxnreg",
                        ".maxclusterrank", ".reqnctapercluster", ".explicitcluster",
                        ".noreturn", ".blocksareclusters"}


def parse_module(text: str, lazy: bool = False) -> Module:
    module = _Parser(tokenize(text, bodies=lazy)).module()
    for fn in module.functions.values():
        if fn.pending is not None:
            _scan_body(module, fn)
    return module


def parse_body(module: Module, fn: Function) -> None:
    """Parse the pending body of `fn` (a function of `module` from a lazy parse); its
    registers and variables are made anew, by the same rules as the scan made them."""
    text, line = fn.pending
    parser = _Parser(tokenize(text, line))
    parser.mod = module
    parser.enter_function(fn)
    fn.registers, fn.variables, fn.body = [], [], []
    parser.function_body(fn)
    fn.pending = None


def parse_integer(text: str) -> int:
    body = text[:-1] if text.endswith("U") else text
    lower = body.lower()
    if lower.startswith("0x"):
        return int(body[2:], 16)
    if lower.startswith("0b"):
        return int(body[2:], 2)
    if len(body) > 1 and body.startswith("0"):
        return int(body, 8)
    return int(body)


def parse_float_bits(text: str) -> Immediate:
    bits = int(text[2:], 16)
    if text[1] in "fF":
        value = struct.unpack("<f", struct.pack("<I", bits))[0]
        return Immediate(value, float_bits=bits, float_width=32)
    value = struct.unpack("<d", struct.pack("<Q", bits))[0]
    return Immediate(value, float_bits=bits, float_width=64)


class _Parser:
    def __init__(self, tokens: list[Token]):
        self.tokens = tokens
        self.pos = 0
        self.mod = Module()
        self.scopes: list[dict[str, Register | Variable]] = []
        self.function: Function | None = None
        # Labels are scoped by { } blocks like registers (inline PTX with a label, inlined
        # or unrolled several times, defines it once per block). Each scope maps a label to
        # its name in the function; names used as operands are resolved when the function
        # ends, since branches may jump forward: (symbol or branch table, the scopes then).
        self.label_scopes: list[dict[str, str]] = []
        self.label_uses: list[tuple[object, list[dict[str, str]]]] = []

    # -- token helpers ------------------------------------------------------------------
    def peek(self, ahead: int = 0) -> Token | None:
        i = self.pos + ahead
        return self.tokens[i] if i < len(self.tokens) else None

    def line(self) -> int:
        tok = self.peek()
        if tok is not None:
            return tok.line
        return self.tokens[-1].line if self.tokens else 1

    def next(self) -> Token:
        tok = self.peek()
        if tok is None:
            raise PtxError("unexpected end of module", self.line())
        self.pos += 1
        return tok

    def at(self, text: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.text == text

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.pos += 1
            return True
        return False

    def expect(self, text: str) -> Token:
        tok = self.next()
        if tok.text != text:
            raise PtxError(f"expected {text!r}, found {tok.text!r}", tok.line)
        return tok

    def expect_kind(self, kind: str, what: str) -> Token:
        tok = self.next()
        if tok.kind != kind:
            raise PtxError(f"expected {what}, found {tok.text!r}", tok.line)
        return tok

    def integer(self) -> int:
        negative = self.accept("-")
        tok = self.expect_kind("num", "an integer")
        try:
            value = parse_integer(tok.text)
        except ValueError:
            raise PtxError(f"expected an integer, found {tok.text!r}", tok.line) from None
        return -value if negative else value

    def skip_line(self, line: int) -> None:
        """Skip the rest of a directive that ends at the end of its line (.loc, .file)."""
        while self.peek() is not None and self.peek().line == line:
            self.pos += 1

    def skip_braces(self) -> None:
        self.expect("{")
        depth = 1
        while depth:
            tok = self.next()
            depth += {"{": 1, "}": -1}.get(tok.text, 0)

    # -- module level -------------------------------------------------------------------
    def module(self) -> Module:
        while self.peek() is not None:
            tok = self.next()
            text = tok.text
            if text == ".version":
                major, _, minor = self.next().text.partition(".")
                self.mod.version = (int(major), int(minor or 0))
            elif text == ".target":
                targets = [self.next().text]
                while self.accept(","):
                    targets.append(self.next().text)
                self.mod.target = tuple(targets)
            elif text == ".address_size":
                self.mod.address_size = self.integer()
                if self.mod.address_size != 64:
                    raise PtxError("only .address_size 64 is supported", tok.line)
            elif text in (".file", ".loc"):
                self.skip_line(tok.line)
            elif text == ".section":
                self.next()
                self.skip_braces()
            elif text == ".pragma":
                self.expect_kind("str", "a string")
                self.expect(";")
            else:
                self.pos -= 1
                self.module_declaration()
        return self.mod

    def module_declaration(self) -> None:
        linkage = ""
        while self.peek() is not None and self.peek().text in _LINKAGE:
            linkage = _LINKAGE[self.next().text]
        tok = self.next()
        if tok.text in (".entry", ".func"):
            self.function_declaration(tok, linkage)
        elif tok.text in _SPACES and tok.text != ".param":
            for var in self.variable_declaration(_SPACES[tok.text], linkage, tok.line):
                self.add_module_variable(var)
        else:
            raise PtxError(f"unsupported directive {tok.text!r}", tok.line)

    def add_module_variable(self, var: Variable) -> None:
        old = self.mod.variables.get(var.name)
        if old is not None and not (old.linkage == "extern" or var.linkage == "extern"
                                    or "weak" in (old.linkage, var.linkage)
                                    or "common" in (old.linkage, var.linkage)):
            raise PtxError(f"variable {var.name!r} defined twice", var.line)
        if old is None or old.linkage == "extern" or (var.init and not old.init):
            self.mod.variables[var.name] = var

    # -- variables ----------------------------------------------------------------------
    def variable_declaration(self, space: str, linkage: str, line: int) -> list[Variable]:
        align = 0
        vector = 1
        managed = False
        ptype: PtxType | None = None
        while True:
            tok = self.next()
            if tok.text == ".align":
                align = self.integer()
            elif tok.text in (".v2", ".v4", ".v8"):
                vector = int(tok.text[2:])
            elif tok.text == ".attribute":
                self.expect("(")
                while not self.accept(")"):
                    managed |= self.next().text == ".managed"
            elif tok.text == ".ptr":
                continue
            elif tok.text.startswith(".") and lookup_type(tok.text[1:]) is not None:
                ptype = lookup_type(tok.text[1:])
                break
            else:
                raise PtxError(f"unexpected {tok.text!r} in variable declaration", tok.line)
        variables = []
        while True:
            name_tok = self.expect_kind("word", "a variable name")
            count = 1
            dims: list[int | None] = []
            while self.accept("["):
                dims.append(None if self.at("]") else self.integer())
                self.expect("]")
            var = Variable(name_tok.text, space, ptype, 0, 0, name_tok.line, linkage,
                           is_array=bool(dims), managed=managed)
            elements: list[Operand] = []
            packed: bytes | None = None  # a flat list of integers, encoded at once
            if self.accept("="):
                if self.at_integer_list(ptype):
                    packed = _packed_integers(self.next().text, ptype)
                else:
                    elements = self.initializer()
            initialized = len(packed) // ptype.nbytes if packed is not None else len(elements)
            for d in dims:
                count *= d if d is not None else 1
            elem_size = ptype.nbytes * vector
            if dims and dims[0] is None:
                if initialized:
                    count = max(1, initialized * ptype.nbytes // elem_size)
                    for d in dims[1:]:
                        count *= d
                else:
                    var.unsized = True
                    count = 0
            var.size = count * elem_size
            var.align = align or (ptype.nbytes * vector)
            if packed:
                var.init = packed[:var.size].ljust(var.size, b"\0") if var.size else packed
                var.size = var.size or len(var.init)
            elif elements:
                self.encode_initializer(var, elements, name_tok.line)
            variables.append(var)
            if not self.accept(","):
                break
        self.expect(";")
        return variables

    def at_integer_list(self, ptype: PtxType) -> bool:
        """Is the next token a flat list of integers (the lexer's "ints") that `ptype`
        stores as they are? For other types, it is put back as ordinary tokens."""
        tok = self.peek()
        if tok is None or tok.kind != "ints":
            return False
        if ptype.kind in "bus":
            return True
        self.tokens[self.pos:self.pos + 1] = tokenize(tok.text, tok.line)
        return False

    def initializer(self) -> list[Operand]:
        """A flat list of initializer elements: numbers or symbols, nesting removed."""
        if self.accept("{"):
            out: list[Operand] = []
            if self.accept("}"):
                return out
            while True:
                out.extend(self.initializer())
                if self.accept("}"):
                    return out
                self.expect(",")
        tok = self.peek()
        if tok is not None and tok.text == "generic":
            self.next()
            self.expect("(")
            name = self.expect_kind("word", "a symbol").text
            self.expect(")")
            offset = self.integer() if self.accept("+") else 0
            return [Symbol(name, offset, generic=True)]
        operand = self.operand()
        if isinstance(operand, Symbol) and self.accept("+"):
            operand.offset = self.integer()
        return [operand]

    def encode_initializer(self, var: Variable, elements: list[Operand], line: int) -> None:
        ptype = var.type
        size = ptype.nbytes
        data = bytearray(max(var.size, size * len(elements)))
        for i, element in enumerate(elements):
            offset = i * size
            if isinstance(element, Symbol):
                var.relocations.append((offset, element.name, element.offset, element.generic))
                continue
            if not isinstance(element, Immediate):
                raise PtxError(f"unsupported initializer for {var.name!r}", line)
            data[offset:offset + size] = encode_scalar(element, ptype)
        var.init = bytes(data[:var.size] if var.size else data)
        if not var.size:
            var.size = len(var.init)

    # -- functions ----------------------------------------------------------------------
    def enter_function(self, fn: Function) -> None:
        self.function = fn
        self.scopes = [{p.name: p for p in (*fn.params, *fn.returns)}]

    def function_declaration(self, kind: Token, linkage: str) -> None:
        fn = Function("", kind.text == ".entry", kind.line, linkage)
        if not fn.is_entry and self.at("("):
            fn.returns = self.parameter_list()
        fn.name = self.expect_kind("word", "a function name").text
        if self.at("("):
            fn.params = self.parameter_list()
        self.enter_function(fn)
        while self.peek() is not None and self.peek().text in _FUNCTION_DIRECTIVES | {".pragma"}:
            tok = self.next()
            if tok.text == ".pragma":
                self.expect_kind("str", "a string")
                self.expect(";")
                continue
            values: list[int] = []
            if self.peek() is not None and self.peek().kind == "num":
                values.append(self.integer())
                while self.accept(","):
                    values.append(self.integer())
            fn.directives[tok.text[1:]] = tuple(values)
        if self.accept(";"):
            fn.body = None
        elif self.peek() is not None and self.peek().kind == "body":
            body = self.next()
            fn.pending = (body.text, body.line)
        else:
            fn.body = []
            self.function_body(fn)
        old = self.mod.functions.get(fn.name)
        if old is not None and old.defined and fn.defined:
            raise PtxError(f"function {fn.name!r} defined twice", fn.line)
        if old is None or fn.defined:
            self.mod.functions[fn.name] = fn
        self.function = None
        self.scopes = []

    def parameter_list(self) -> list[Variable]:
        self.expect("(")
        params: list[Variable] = []
        if self.accept(")"):
            return params
        while True:
            tok = self.next()
            if tok.text != ".param":
                raise PtxError(f"unsupported parameter declaration {tok.text!r}", tok.line)
            params.append(self.parameter())
            if self.accept(")"):
                return params
            self.expect(",")

    def parameter(self) -> Variable:
        align = 0
        ptype = None
        while True:
            tok = self.next()
            if tok.text == ".align":
                value = self.integer()
                if ptype is None:
                    align = value
            elif tok.text in (".ptr", ".global", ".const", ".shared", ".local"):
                continue
            elif tok.text.startswith(".") and lookup_type(tok.text[1:]) is not None:
                ptype = lookup_type(tok.text[1:])
            elif tok.kind == "word" and ptype is not None:
                name = tok.text
                break
            else:
                raise PtxError(f"unexpected {tok.text!r} in parameter", tok.line)
        count = 1
        is_array = False
        while self.accept("["):
            is_array = True
            count *= self.integer()
            self.expect("]")
        size = ptype.nbytes * count
        return Variable(name, "param", ptype, size, align or ptype.nbytes, tok.line,
                        is_array=is_array)

    def declare(self, name: str, item: Register | Variable, line: int) -> None:
        scope = self.scopes[-1]
        if name in scope:
            raise PtxError(f"{name!r} declared twice in one scope", line)
        scope[name] = item

    def function_body(self, fn: Function) -> None:
        self.expect("{")
        self.scopes.append({})
        self.label_scopes = [{}]
        self.label_uses = []
        while self.scopes and len(self.scopes) > 1:
            tok = self.next()
            text = tok.text
            if text == "{":
                self.scopes.append({})
                self.label_scopes.append({})
            elif text == "}":
                self.scopes.pop()
                self.label_scopes.pop()
            elif text == ".reg":
                self.register_declaration(fn, tok.line)
            elif text in _SPACES:
                for var in self.variable_declaration(_SPACES[text], "", tok.line):
                    self.declare(var.name, var, tok.line)
                    fn.variables.append(var)
            elif text in (".loc", ".file"):
                self.skip_line(tok.line)
            elif text == ".pragma":
                self.expect_kind("str", "a string")
                self.expect(";")
            elif tok.kind == "word" and self.at(":"):
                self.next()
                if text in self.label_scopes[-1]:
                    raise PtxError(f"label {text!r} defined twice", tok.line)
                name = text
                while name in fn.labels:  # the same label in another block
                    name += "#"
                self.label_scopes[-1][text] = name
                fn.labels[name] = len(fn.body)
                if self.accept(".branchtargets"):
                    targets = [self.expect_kind("word", "a label").text]
                    while self.accept(","):
                        targets.append(self.expect_kind("word", "a label").text)
                    self.expect(";")
                    fn.branch_tables[name] = targets
                    self.label_uses.append((targets, list(self.label_scopes)))
                elif self.accept(".callprototype") or self.accept(".calltargets"):
                    # The signature or the possible targets of an indirect call (function
                    # pointers, virtual functions): the call finds its target by address
                    # and passes arguments as the callee declares them, so neither is kept.
                    while self.next().text != ";":
                        pass
            elif text == "@" or (tok.kind == "word" and not text.startswith(".")):
                self.pos -= 1
                fn.body.append(self.instruction())
            else:
                raise PtxError(f"unsupported directive {text!r} in function body", tok.line)
        self._resolve_labels()
        self.label_scopes, self.label_uses = [], []
        fn.callees = {instr.operands[0 if isinstance(instr.operands[0], Symbol) else 1].name
                      for instr in fn.body if instr.opcode == "call" and _direct_call(instr)}
        fn.symbols = _referenced_symbols(fn)
        fn.calls_indirectly = any(instr.opcode == "call" and not _direct_call(instr)
                                  for instr in fn.body)

    def _resolve_labels(self) -> None:
        """Point each label used in the function at the one its enclosing blocks define."""
        def resolve(name: str, scopes: list[dict[str, str]]) -> str:
            for scope in reversed(scopes):
                if name in scope:
                    return scope[name]
            return name
        for use, scopes in self.label_uses:
            if isinstance(use, Symbol):
                use.name = resolve(use.name, scopes)
            else:
                use[:] = [resolve(name, scopes) for name in use]

    def register_declaration(self, fn: Function, line: int) -> None:
        tok = self.next()
        if tok.text in (".v2", ".v4"):
            raise PtxError("vector registers are not supported", tok.line)
        ptype = lookup_type(tok.text[1:]) if tok.text.startswith(".") else None
        if ptype is None:
            raise PtxError(f"unknown register type {tok.text!r}", tok.line)
        while True:
            name = self.expect_kind("word", "a register name").text
            if self.accept("<"):
                count = self.integer()
                self.expect(">")
                names = [f"{name}{i}" for i in range(count)]
            else:
                names = [name]
            for n in names:
                reg = Register(self.mod.register_count, n, ptype)
                self.mod.register_count += 1
                fn.registers.append(reg)
                self.declare(n, reg, line)
            if not self.accept(","):
                break
        self.expect(";")

    # -- instructions -------------------------------------------------------------------
    def instruction(self) -> Instruction:
        guard = None
        if self.accept("@"):
            negate = self.accept("!")
            guard = self.register(self.expect_kind("word", "a predicate"), negate)
        tok = self.expect_kind("word", "an instruction")
        opcode, *mods = tok.text.split(".")
        instr = Instruction(opcode, tuple(mods), [], tok.line, guard)
        if self.accept(";"):
            return instr
        while True:
            instr.operands.append(self.operand())
            if len(instr.operands) == 1 and self.accept("|"):
                instr.pair = self.operand()
            if self.accept(";"):
                return instr
            self.expect(",")

    def register(self, tok: Token, negate: bool = False) -> RegisterOperand:
        item = self.lookup(tok.text)
        if not isinstance(item, Register):
            raise PtxError(f"{tok.text!r} is not a declared register", tok.line)
        return RegisterOperand(item, negate)

    def lookup(self, name: str) -> Register | Variable | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def operand(self) -> Operand:
        tok = self.next()
        text = tok.text
        if text == "{":
            elements = []
            while True:
                elements.append(self.operand())
                if self.accept("}"):
                    return Vector(elements)
                self.expect(",")
        if text == "[":
            return self.address()
        if text == "(":
            elements = []
            if self.accept(")"):
                return ListOperand(elements)
            while True:
                elements.append(self.operand())
                if self.accept(")"):
                    return ListOperand(elements)
                self.expect(",")
        if text == "-":
            tok2 = self.next()
            if tok2.kind == "num":
                value = parse_number(tok2)
                return Immediate(-value)
            raise PtxError(f"unexpected {tok2.text!r} after '-'", tok2.line)
        if text == "!":
            return self.register(self.expect_kind("word", "a predicate"), negate=True)
        if tok.kind == "num":
            return Immediate(parse_number(tok))
        if tok.kind == "fbits":
            return parse_float_bits(text)
        if tok.kind == "word":
            if text == "_":
                return Sink()
            if text == "WARP_SZ":   # the one predefined constant identifier
                return Immediate(32)
            item = self.lookup(text)
            if isinstance(item, Register):
                return RegisterOperand(item)
            if isinstance(item, Variable):
                return Symbol(text, 0, variable=item)
            if text in SPECIAL_REGISTERS:
                return SpecialRegister(text)
            if text.startswith("%"):
                raise PtxError(f"undeclared register {text!r}", tok.line)
            symbol = Symbol(text)
            if self.label_scopes:
                self.label_uses.append((symbol, list(self.label_scopes)))
            return symbol
        raise PtxError(f"unexpected {text!r} in operand", tok.line)

    def address(self) -> Address:
        base: RegisterOperand | Symbol | None = None
        offset = 0
        sign = 1
        while True:
            tok = self.next()
            if tok.kind == "num":
                offset += sign * parse_integer(tok.text)
            elif tok.kind == "word" and base is None and sign == 1:
                item = self.lookup(tok.text)
                if isinstance(item, Register):
                    base = RegisterOperand(item)
                elif isinstance(item, Variable):
                    base = Symbol(tok.text, 0, variable=item)
                else:
                    base = Symbol(tok.text)
            else:
                raise PtxError(f"unexpected {tok.text!r} in address", tok.line)
            if self.accept("]"):
                return Address(base, offset)
            if self.accept(","):
                coordinates = self.operand()
                if not isinstance(coordinates, Vector):
                    raise PtxError("expected {coordinates} after the handle", tok.line)
                self.expect("]")
                return Address(base, offset, coordinates)
            sign = 1
            while True:
                if self.accept("+"):
                    continue
                if self.accept("-"):
                    sign = -sign
                    continue
                break


def _packed_integers(text: str, ptype: PtxType) -> bytes:
    """The bytes of a flat list of decimal integers as `ptype` values (wrapped to its
    width, as encode_scalar does)."""
    items = text[1:-1].split(",")
    if len(items) > 1 and not all(item.strip() for item in items):
        raise PtxError("expected an integer in the initializer, found ','")
    values = [int(item) for item in items if item.strip()]
    mask = (1 << (8 * ptype.nbytes)) - 1
    if all(v <= mask for v in values):
        return np.array(values, dtype=f"<u{ptype.nbytes}").tobytes()
    return b"".join((v & mask).to_bytes(ptype.nbytes, "little") for v in values)


def parse_number(tok: Token) -> int | float:
    text = tok.text
    if "." in text or ("e" in text.lower() and not text.lower().startswith("0x")):
        return float(text)
    return parse_integer(text)


def encode_scalar(imm: Immediate, ptype: PtxType) -> bytes:
    """The bytes of an initializer element of type `ptype`."""
    size = ptype.nbytes
    if ptype.name in ("f32", "f64") and imm.float_bits is None:
        return struct.pack("<f" if size == 4 else "<d", float(imm.value))
    if ptype.name in ("f32", "f64") and imm.float_width != ptype.bits:
        return struct.pack("<f" if size == 4 else "<d", imm.value)
    if imm.float_bits is not None:
        return (imm.float_bits & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
    return (int(imm.value) & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


def _direct_call(instr: Instruction) -> bool:
    """Does this `call` name its target (rather than call through a register)?"""
    operands = instr.operands
    first = 1 if operands and isinstance(operands[0], ListOperand) else 0
    return len(operands) > first and isinstance(operands[first], Symbol)


def _referenced_symbols(fn: Function) -> set[str]:
    """Names of module-scope symbols (and labels) a function's instructions mention."""
    return set().union(*map(referenced_symbols, fn.body))


def referenced_symbols(instr: Instruction) -> set[str]:
    """Names of module-scope symbols (and labels) an instruction mentions."""
    names: set[str] = set()

    def visit(operand) -> None:
        if isinstance(operand, Symbol):
            if operand.variable is None:
                names.add(operand.name)
        elif isinstance(operand, Address):
            visit(operand.base)
        elif isinstance(operand, (Vector, ListOperand)):
            for element in operand.elements:
                visit(element)
    for operand in instr.operands:
        visit(operand)
    return names


# -- scanning a pending body ------------------------------------------------------------
# A statement starts after `;`, `{`, `}` or a label's `:`. Those that declare variables are
# parsed as a full parse does, in the same order, so the sizes in a kernel's layout come
# out the same; register declarations are counted (`%r<120>` is 120 registers of its type).
# Calls name their target first, after an optional list of results. Module variables
# count as mentioned where their name stands alone (not part of a longer name, a register
# or a modifier).
_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# (Each pattern starts with its literal text, which the regex engine finds quickly.)
_DECLARATION_RE = re.compile(r"\.(?<![\w$%]\.)(?:shared|local|param|global|const)\b[^;]*;")
_REGISTERS_RE = re.compile(r"\.reg(?<![\w$%]\.reg)\s*\.(\w+)\s+([^;]*);")
_REGISTER_ITEM_RE = re.compile(r"\s*([%\w$]+)\s*(?:<\s*(\d+)\s*>)?\s*$")
_CALL_RE = re.compile(r"call(?<![\w$.%]call)(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?([A-Za-z_$][\w$]*)")
_INDIRECT_CALL_RE = re.compile(r"call(?<![\w$.%]call)(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?%")
_STATEMENT_START = ";{}:"


def _scan_body(module: Module, fn: Function) -> None:
    text, first_line = fn.pending
    text = _COMMENT_RE.sub(lambda m: "\n" * m.group().count("\n"), text)
    declared: set[str] = set()
    for m in _DECLARATION_RE.finditer(text):
        if not _starts_statement(text, m.start()):
            continue  # `(.param .b64 _)` in a call prototype
        parser = _Parser(tokenize(m.group(), first_line + text.count("\n", 0, m.start())))
        parser.mod = module
        parser.enter_function(fn)
        directive = parser.next()
        for var in parser.variable_declaration(_SPACES[directive.text], "", directive.line):
            fn.variables.append(var)
            declared.add(var.name)
    for m in _REGISTERS_RE.finditer(text):
        if _starts_statement(text, m.start()):
            fn.registers += _scanned_registers(m, text, first_line)
    fn.callees = {name for name in _CALL_RE.findall(text) if name in module.functions}
    fn.calls_indirectly = _INDIRECT_CALL_RE.search(text) is not None
    fn.symbols = fn.callees | {name for name in module.variables
                               if name not in declared and name in text
                               and re.search(rf"(?<![\w$.%]){re.escape(name)}(?![\w$])", text)}


def _starts_statement(text: str, pos: int) -> bool:
    """Is `pos` the start of a statement: after `;`, `{`, `}` or `:`, and blanks?"""
    pos -= 1
    while pos >= 0 and text[pos] in " \t\r\n":
        pos -= 1
    return pos < 0 or text[pos] in _STATEMENT_START


def _scanned_registers(m: re.Match, text: str, first_line: int) -> list[Register]:
    """The registers a `.reg` statement declares, as far as a kernel's layout needs them:
    their number and type (one object, repeated, for each name or `name<N>` range; the
    body's parse makes the real ones)."""
    line = first_line + text.count("\n", 0, m.start())
    ptype = lookup_type(m.group(1))
    if ptype is None:
        raise PtxError(f"unknown register type '.{m.group(1)}'", line)
    registers: list[Register] = []
    for item in m.group(2).split(","):
        found = _REGISTER_ITEM_RE.match(item)
        if found is None:
            raise PtxError(f"expected a register name, found {item.strip()!r}", line)
        name, count = found.groups()
        registers += [Register(-1, name, ptype)] * (int(count) if count else 1)
    return registers
