"""Reads NVIDIA's C headers into declarations the generators can work with.

The headers are run through gcc's preprocessor (so every macro, `#if` and versioned-name
`#define` is resolved exactly as a compiler sees it), only the lines that come from the headers
themselves are kept (not libc's), and the result is parsed with pycparser. This is a dev-time
tool: it needs gcc and the CUDA toolkit headers, which a machine that only builds vgpu lacks.
"""

from __future__ import annotations

import copy
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pycparser import c_ast, c_generator, c_parser

__all__ = [
    "Param",
    "Prototype",
    "Declarations",
    "EnumType",
    "ApiHeaders",
    "enum_types",
    "int_macros",
    "preprocess",
    "keep_lines_from",
    "parse_declarations",
    "render",
    "strip_attributes",
    "evaluate_int_expressions",
    "fold_array_sizes",
    "check_same_types",
]

# Types the headers take from libc; pycparser needs them declared before it can parse.
_LIBC_TYPES = """
typedef unsigned long size_t;
typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
typedef int int32_t;
"""

_LINEMARKER = re.compile(r'^# (\d+) "(.*)"')
_GENERATOR = c_generator.CGenerator()


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a C function: its type as C writes it without the name, and its name."""

    ctype: str
    name: str


@dataclass(frozen=True, slots=True)
class Prototype:
    """A C function declaration, with the text that declares it."""

    name: str
    restype: str
    params: tuple[Param, ...]
    declaration: str

    @property
    def signature(self) -> tuple[str, ...]:
        """Return and parameter types: what must agree between two declarations of a symbol."""
        return (self.restype, *(param.ctype for param in self.params))


@dataclass(frozen=True, slots=True)
class EnumType:
    """A C enum: its Python name, members in header order, the typedefs aliasing it, and
    every way C spells its type (`cudaMemcpyKind`, `enum cudaMemcpyKind`)."""

    name: str
    members: tuple[tuple[str, int], ...]
    aliases: tuple[str, ...]
    c_spellings: frozenset[str]


@dataclass
class ApiHeaders:
    """An API as its headers declare it: what every generator output is made from."""

    types_text: str                      # typedefs, structs, unions, enums (as C reads them)
    prototypes: dict[str, Prototype]     # every exported symbol, sorted by name
    enums: list[EnumType]
    macros: dict[str, int]

    def enum_of(self, ctype: str) -> str | None:
        """The enum a parameter type names (through aliases), if it is one."""
        for enum in self.enums:
            if ctype in enum.c_spellings:
                return enum.name
        return None


@dataclass
class Declarations:
    """What a header declares: type declarations (in order) and function prototypes by name."""

    types: list[c_ast.Node]
    prototypes: dict[str, Prototype]

    def types_text(self) -> str:
        return render(self.types)


def strip_attributes(text: str) -> tuple[str, list[tuple[str, str]]]:
    """Removes GNU `__attribute__((...))`, which neither pycparser nor cffi read.

    Returns the text and, for each struct or union that carried one (`struct
    __attribute__((aligned(8))) int2`), its name and the attribute: its layout is then not
    what the bare declaration says, and cffi must take it from the compiler.
    """
    pieces: list[str] = []
    marked: list[tuple[str, str]] = []
    position = 0
    for match in re.finditer(r"__attribute__\s*\(\(", text):
        if match.start() < position:
            continue  # inside an attribute already removed
        depth, end = 0, match.end() - 2
        for end in range(match.end() - 2, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        tagged = re.match(r"\s*(\w+)", text[end + 1:])
        if re.search(r"\b(struct|union)\s*$", text[position:match.start()]) and tagged:
            marked.append((tagged.group(1), text[match.start():end + 1]))
        pieces.append(text[position:match.start()])
        position = end + 1
    pieces.append(text[position:])
    return "".join(pieces), marked


def render(nodes: Iterable[c_ast.Node]) -> str:
    """Top-level declarations as C text."""
    return "".join(_GENERATOR.visit(c_ast.FileAST(ext=[node])) for node in nodes)


def preprocess(source: str, include_dirs: Sequence[Path], defines: Iterable[str] = ()) -> str:
    """Runs `gcc -E` on `source` and returns the output with its linemarkers."""
    cmd = ["gcc", "-E", "-std=gnu11", *(f"-I{d}" for d in include_dirs),
           *(f"-D{d}" for d in defines), "-x", "c", "-"]
    return subprocess.run(cmd, input=source, capture_output=True, text=True, check=True).stdout


def keep_lines_from(preprocessed: str, header_dir: Path) -> str:
    """Keeps only the lines that files directly inside `header_dir` produced."""
    header_dir = header_dir.resolve()
    kept: list[str] = []
    keeping = False
    for line in preprocessed.splitlines():
        marker = _LINEMARKER.match(line)
        if marker:
            keeping = Path(marker.group(2)).resolve().parent == header_dir
        elif keeping and line.strip():
            kept.append(line)
    return "\n".join(kept) + "\n"


def parse_declarations(text: str, prelude: str = "") -> Declarations:
    """Parses C declarations; `prelude` declares the foreign types `text` uses (not returned)."""
    parser = c_parser.CParser()
    skipped = len(parser.parse(_LIBC_TYPES + prelude).ext)
    nodes = parser.parse(_LIBC_TYPES + prelude + text).ext[skipped:]
    types: list[c_ast.Node] = []
    prototypes: dict[str, Prototype] = {}
    for node in nodes:
        if isinstance(node, (c_ast.Pragma, c_ast.FuncDef)):
            continue  # no declarations: `#pragma GCC diagnostic`, static inline helpers
        if isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
            proto = _prototype(node)
            known = prototypes.setdefault(proto.name, proto)
            if known.signature != proto.signature:
                raise ValueError(f"conflicting declarations:\n{known.declaration}\n"
                                 f"{proto.declaration}")
        else:
            types.append(node)
    return Declarations(types, prototypes)


def _type_text(node: c_ast.Node) -> str:
    """A type node as C writes it in a cast, e.g. `const char **` or `void (*)(void *)`."""
    node = copy.deepcopy(node)
    inner = node
    while not isinstance(inner, c_ast.TypeDecl):
        inner = inner.type
    inner.declname = None
    return _GENERATOR.visit(c_ast.Typename(name=None, quals=[], align=None, type=node)).strip()


def _decayed(node: c_ast.Node) -> c_ast.Node:
    """A parameter declared as an array is a pointer (C's array-to-pointer adjustment)."""
    if isinstance(node, c_ast.ArrayDecl):
        return c_ast.PtrDecl(quals=list(node.dim_quals or []), type=node.type)
    return node


def _prototype(node: c_ast.Decl) -> Prototype:
    func: c_ast.FuncDecl = node.type
    params: list[Param] = []
    for index, param in enumerate(func.args.params if func.args else []):
        if isinstance(param, c_ast.EllipsisParam):
            raise ValueError(f"{node.name}: variadic functions are not supported")
        ptype = _decayed(param.type)
        ctype = _type_text(ptype)
        if ctype == "void" and not param.name:
            continue  # `f(void)`
        params.append(Param(ctype, param.name or f"arg{index}"))
    node = copy.copy(node)
    node.storage = []  # `extern`: the declaration is also the stub's definition line
    declaration = _GENERATOR.visit(c_ast.FileAST(ext=[node])).strip()
    return Prototype(node.name, _type_text(func.type), tuple(params), declaration)


def int_macros(source: str, include_dirs: Sequence[Path], pattern: str,
               exclude: Callable[[str], bool] = lambda value: False) -> dict[str, int]:
    """Object-like macros named like `pattern` whose value is an integer (or a pointer
    constant, given as its integer); `exclude(expansion)` drops others, such as macros that
    rename functions (`#define cudaMemcpy cudaMemcpy_ptds` would "evaluate" to an address)."""
    cmd = ["gcc", "-E", "-dM", *(f"-I{d}" for d in include_dirs), "-x", "c", "-"]
    out = subprocess.run(cmd, input=source, capture_output=True, text=True, check=True).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(None, 2)
        if (len(parts) == 3 and "(" not in parts[1] and re.fullmatch(pattern, parts[1])
                and not exclude(parts[2].strip())):
            names.append(parts[1])
    return evaluate_int_expressions(source, include_dirs, sorted(names))


def enum_types(types: list[c_ast.Node], c_source: str) -> list[EnumType]:
    """The enums with a body among `types`, values computed by gcc compiling `c_source`.

    `typedef enum X_enum {...} X;` is named X; `enum X {...};` (the runtime's style) is named
    X, and `typedef enum X X_t;` makes X_t an alias.
    """
    members: dict[str, list[str]] = {}          # name -> member names, in header order
    spellings: dict[str, set[str]] = {}
    aliases: dict[str, list[str]] = {}
    by_spelling: dict[str, str] = {}
    for node in types:
        typedef = isinstance(node, c_ast.Typedef) and isinstance(node.type, c_ast.TypeDecl)
        target = node.type.type if typedef else getattr(node, "type", None)
        if isinstance(target, c_ast.Enum) and target.values:
            name = node.name if typedef else target.name
            members[name] = [e.name for e in target.values.enumerators]
            spellings[name] = {name} | ({f"enum {target.name}"} if target.name else set())
            aliases[name] = []
            by_spelling.update(dict.fromkeys(spellings[name], name))
        elif typedef and isinstance(target, (c_ast.IdentifierType, c_ast.Enum)):
            spelled = (f"enum {target.name}" if isinstance(target, c_ast.Enum)
                       else " ".join(target.names))
            if spelled in by_spelling:
                name = by_spelling[spelled]
                aliases[name].append(node.name)
                spellings[name].add(node.name)
                by_spelling[node.name] = name
    values = evaluate_int_expressions(c_source, [], [m for ms in members.values() for m in ms])
    return [EnumType(name, tuple((m, values[m]) for m in ms), tuple(aliases[name]),
                     frozenset(spellings[name])) for name, ms in members.items()]


def evaluate_int_expressions(source: str, include_dirs: Sequence[Path],
                             expressions: Sequence[str]) -> dict[str, int]:
    """Values of C integer (or pointer-constant) expressions after `source`, computed by gcc.

    An expression that is not an integer (a macro naming a calling convention, a string)
    fails to compile; its line is dropped and the program is built again without it.
    """
    usable = list(dict.fromkeys(expressions))
    prefix = f"{source}\n#include <stdio.h>\nint main(void) {{\n"
    first_line = prefix.count("\n") + 1
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "evaluate"
        while True:
            body = "".join(f'printf("%lld\\n", (long long)({expr}));\n' for expr in usable)
            cmd = ["gcc", "-x", "c", "-", "-o", str(exe), *(f"-I{d}" for d in include_dirs)]
            build = subprocess.run(cmd, input=f"{prefix}{body}return 0;\n}}\n", text=True,
                                   capture_output=True)
            if build.returncode == 0:
                break
            bad = {int(m) - first_line for m in re.findall(r"^<stdin>:(\d+):\d+: error",
                                                           build.stderr, re.MULTILINE)}
            if not bad or min(bad) < 0 or max(bad) >= len(usable):
                raise RuntimeError(f"cannot evaluate expressions:\n{build.stderr}")
            usable = [expr for index, expr in enumerate(usable) if index not in bad]
        out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return dict(zip(usable, map(int, out.split()), strict=True))


def fold_array_sizes(decls: Declarations, source: str, include_dirs: Sequence[Path]) -> None:
    """Replaces array sizes written as expressions (`8 - sizeof(x)`) by their values.

    cffi's parser accepts only plain numbers there; gcc, compiling `source`, knows the values.
    """
    arrays = [node for top in decls.types for node in _walk(top)
              if isinstance(node, c_ast.ArrayDecl) and node.dim is not None
              and not isinstance(node.dim, c_ast.Constant)]
    texts = [_GENERATOR.visit(node.dim) for node in arrays]
    values = evaluate_int_expressions(source, include_dirs, texts)
    for node, text in zip(arrays, texts, strict=True):
        node.dim = c_ast.Constant("int", str(values[text]))


def _walk(node: c_ast.Node) -> Iterable[c_ast.Node]:
    yield node
    for _, child in node.children():
        yield from _walk(child)


def check_same_types(pairs: Iterable[tuple[str, str]], source: str,
                     include_dirs: Sequence[Path]) -> None:
    """Asserts, through gcc, that each (type, expression) pair has the same type.

    gcc sees through typedefs exactly as a C caller does, so `PFN_cuMemAlloc_v3020` and
    `&cuMemAlloc_v2` compare equal even when spelled with different typedef names.
    """
    checks = "".join(f'_Static_assert(__builtin_types_compatible_p({kind}, __typeof__({expr})), '
                     f'"{kind} is not the type of {expr}");\n' for kind, expr in pairs)
    build = subprocess.run(["gcc", "-fsyntax-only", "-x", "c", "-",
                            *(f"-I{d}" for d in include_dirs)],
                           input=f"{source}\n{checks}", text=True, capture_output=True)
    if build.returncode != 0:
        raise ValueError(f"type mismatch:\n{build.stderr}")
