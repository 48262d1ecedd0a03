"""The parsed form of a PTX module: what the parser produces and the compiler consumes.

Names are resolved by the parser where PTX scoping decides them (registers and the variables
declared inside a function body, including the `.param` variables of each call sequence,
which reuse names like `param0` in sibling `{ }` scopes); module-scope names (variables,
functions, labels) stay names until the module is complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ptx_types import PtxType

__all__ = [
    "Address",
    "Function",
    "Immediate",
    "Instruction",
    "ListOperand",
    "Module",
    "Operand",
    "Register",
    "RegisterOperand",
    "Sink",
    "SpecialRegister",
    "Symbol",
    "Variable",
    "Vector",
]


@dataclass(eq=False)
class Register:
    id: int            # module-wide index into the register file
    name: str
    type: PtxType


@dataclass(eq=False)
class Variable:
    """A `.global/.const/.shared/.local/.param` variable (module or function scope)."""
    name: str
    space: str                 # "global", "const", "shared", "local", "param"
    type: PtxType
    size: int                  # bytes (0 for an unsized `extern` array)
    align: int
    line: int
    linkage: str = ""          # "", "visible", "extern", "weak", "common"
    init: bytes = b""
    # (byte offset, symbol name, addend, generic) for initializers naming other variables.
    relocations: list[tuple[int, str, int, bool]] = field(default_factory=list)
    is_array: bool = False
    unsized: bool = False      # `extern .shared .b8 dyn[]`: the launch's dynamic shared memory
    managed: bool = False      # `.attribute(.managed)`: a __managed__ variable


@dataclass
class RegisterOperand:
    reg: Register
    negate: bool = False       # `!%p` as a predicate source


@dataclass
class Immediate:
    value: int | float
    # Float literals keep their bit pattern: `0f3F800000` has float_width 32, `0d...` 64.
    float_bits: int | None = None
    float_width: int = 0

    @property
    def is_float(self) -> bool:
        return isinstance(self.value, float)


@dataclass
class Symbol:
    """A name used as a value: a variable's address, a label or a function."""
    name: str
    offset: int = 0
    variable: Variable | None = None  # set when the parser resolved it to a function-scope var
    generic: bool = False             # `generic(name)` in an initializer


@dataclass
class SpecialRegister:
    name: str  # "%tid.x", "%laneid", "%envreg3", ...


@dataclass
class Address:
    """`[base+offset]`; base is a register, a symbol, or None for an absolute address.
    Texture and surface instructions add coordinates: `[handle, {x, y}]`."""
    base: RegisterOperand | Symbol | None
    offset: int = 0
    coordinates: Vector | None = None


@dataclass
class Vector:
    elements: list[Operand]


@dataclass
class ListOperand:
    """A parenthesised list: the return and argument lists of `call`."""
    elements: list[Operand]


@dataclass
class Sink:
    """`_`: a destination whose value is discarded."""


Operand = (RegisterOperand | Immediate | Symbol | SpecialRegister | Address | Vector
           | ListOperand | Sink)


@dataclass(eq=False)
class Instruction:
    opcode: str                       # "add", "ld", "shfl", ...
    modifiers: tuple[str, ...]        # ("global", "v4", "f32")
    operands: list[Operand]
    line: int
    guard: RegisterOperand | None = None
    # `shfl.sync ... d|p` and `setp ... p|q`: the second destination of a pair.
    pair: Operand | None = None

    @property
    def text(self) -> str:
        return ".".join((self.opcode, *self.modifiers))


@dataclass(eq=False)
class Function:
    name: str
    is_entry: bool
    line: int
    linkage: str = ""
    params: list[Variable] = field(default_factory=list)
    returns: list[Variable] = field(default_factory=list)
    body: list[Instruction] | None = None           # None: a declaration only
    labels: dict[str, int] = field(default_factory=dict)  # label -> instruction index
    # label -> targets, for `.branchtargets` tables used by brx.idx
    branch_tables: dict[str, list[str]] = field(default_factory=dict)
    registers: list[Register] = field(default_factory=list)
    variables: list[Variable] = field(default_factory=list)  # .local/.shared/.param in body
    directives: dict[str, tuple[int, ...]] = field(default_factory=dict)  # maxntid, reqntid
    # What the body calls (functions by name) and which module-scope names it mentions:
    # a kernel's reachable functions and layout follow from them.
    callees: set[str] = field(default_factory=set)
    symbols: set[str] = field(default_factory=set)
    calls_indirectly: bool = False   # has a call through a register
    # A body not parsed yet: (its text from `{` to `}`, the line it starts on). Its
    # registers, variables, callees and symbols are filled in from a scan of that text.
    pending: tuple[str, int] | None = None

    @property
    def defined(self) -> bool:
        """Has a body (parsed or pending), as opposed to a declaration only."""
        return self.body is not None or self.pending is not None


@dataclass
class Module:
    version: tuple[int, int] = (0, 0)
    target: tuple[str, ...] = ()
    address_size: int = 64
    functions: dict[str, Function] = field(default_factory=dict)
    variables: dict[str, Variable] = field(default_factory=dict)
    register_count: int = 0
