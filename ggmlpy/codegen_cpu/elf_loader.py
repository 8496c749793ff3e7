"""Load an x86-64 ELF relocatable object (our own compiler's output) without LLVM.

Why: MCJIT needs libllvmlite.so, whose 178 MB get relocated and partly paged in (~40-70 MiB
resident) just to copy our object code into memory and patch a few hundred offsets. The
objects `target_machine().emit_object` writes here are simple (PIC, default code model, no
constructors, no TLS), so a small loader does the same job: map the allocatable sections,
resolve symbols (external ones through the process's C library), apply the relocations, and
protect the memory (code read+execute, constants read-only, data read+write; never writable
and executable at once). Anything it does not understand raises ElfLoadError, and the caller
falls back to MCJIT.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import struct
from dataclasses import dataclass

PAGE = mmap.PAGESIZE

# ELF constants (System V gABI, x86-64 psABI)
SHT_PROGBITS, SHT_SYMTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 1, 2, 4, 8, 9
SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY = 14, 15, 16
SHT_X86_64_UNWIND = 0x70000001
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR, SHF_TLS = 0x1, 0x2, 0x4, 0x400
SHN_UNDEF, SHN_ABS, SHN_COMMON, SHN_XINDEX, SHN_LORESERVE = 0, 0xFFF1, 0xFFF2, 0xFFFF, 0xFF00
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
STT_SECTION, STT_TLS = 3, 6

R_NAMES = {0: "R_X86_64_NONE", 1: "R_X86_64_64", 2: "R_X86_64_PC32", 3: "R_X86_64_GOT32",
           4: "R_X86_64_PLT32", 5: "R_X86_64_COPY", 6: "R_X86_64_GLOB_DAT",
           7: "R_X86_64_JUMP_SLOT", 8: "R_X86_64_RELATIVE", 9: "R_X86_64_GOTPCREL",
           10: "R_X86_64_32", 11: "R_X86_64_32S", 12: "R_X86_64_16", 13: "R_X86_64_PC16",
           14: "R_X86_64_8", 15: "R_X86_64_PC8", 19: "R_X86_64_TLSGD", 20: "R_X86_64_TLSLD",
           21: "R_X86_64_DTPOFF32", 22: "R_X86_64_GOTTPOFF", 23: "R_X86_64_TPOFF32",
           24: "R_X86_64_PC64", 25: "R_X86_64_GOTOFF64", 26: "R_X86_64_GOTPC32",
           41: "R_X86_64_GOTPCRELX", 42: "R_X86_64_REX_GOTPCRELX"}
R_NONE, R_64, R_PC32, R_PLT32, R_GOTPCREL, R_32, R_32S = 0, 1, 2, 4, 9, 10, 11
R_GOTPCRELX, R_REX_GOTPCRELX = 41, 42
GOT_RELOCS = (R_GOTPCREL, R_GOTPCRELX, R_REX_GOTPCRELX)
SUPPORTED = {R_NONE, R_64, R_PC32, R_PLT32, R_32, R_32S, *GOT_RELOCS}

STUB_SIZE = 16  # jmp *0(%rip); .quad target; 2 bytes of int3
STUB_CODE = b"\xff\x25\x00\x00\x00\x00"

PROT_READ, PROT_WRITE, PROT_EXEC = 0x1, 0x2, 0x4
MAP_PRIVATE, MAP_ANONYMOUS, MAP_32BIT = 0x02, 0x20, 0x40
MAP_FAILED = ctypes.c_void_p(-1).value


class ElfLoadError(Exception):
    """The object cannot be loaded by this loader (the caller falls back to MCJIT)."""


@dataclass
class Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    align: int
    entsize: int
    loaded: bool = False
    address: int = 0  # where it is mapped (an offset in the image until then)


@dataclass
class Symbol:
    name: str
    bind: int
    type: int
    shndx: int
    value: int


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mprotect.restype = ctypes.c_int
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


@functools.lru_cache(maxsize=1)
def _symbol_libraries() -> list[ctypes.CDLL]:
    """The process's global namespace first (libc, libm are linked into python), then the
    libraries compiler-generated calls may need if python did not pull them in."""
    libs = [ctypes.CDLL(None)]
    for name in ("m", "c", "gcc_s"):
        path = ctypes.util.find_library(name)
        if path:
            try:
                libs.append(ctypes.CDLL(path))
            except OSError:
                pass
    return libs


@functools.lru_cache(maxsize=None)
def resolve_external(name: str) -> int | None:
    """The address of a C function or variable of this process (dlsym), or None."""
    for lib in _symbol_libraries():
        try:
            return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        except AttributeError:
            continue
    return None


class _Reader:
    """Bounds-checked little-endian reads from the object's bytes."""

    def __init__(self, data: bytes):
        self.data = data

    def unpack(self, fmt: str, offset: int, what: str) -> tuple:
        size = struct.calcsize(fmt)
        if offset < 0 or offset + size > len(self.data):
            raise ElfLoadError(f"truncated object: {what} at {offset}+{size} is past the end "
                               f"({len(self.data)} bytes)")
        return struct.unpack_from(fmt, self.data, offset)

    def bytes(self, offset: int, size: int, what: str) -> bytes:
        if offset < 0 or size < 0 or offset + size > len(self.data):
            raise ElfLoadError(f"truncated object: {what} at {offset}+{size} is past the end "
                               f"({len(self.data)} bytes)")
        return self.data[offset:offset + size]

    def cstring(self, table: Section, offset: int) -> str:
        start = table.offset + offset
        end = self.data.find(b"\0", start, table.offset + table.size)
        if offset >= table.size or end < 0:
            raise ElfLoadError(f"bad string offset {offset} in {table.name or 'a string table'}")
        return self.data[start:end].decode("utf-8", "replace")


def _parse_sections(r: _Reader) -> list[Section]:
    ident = r.bytes(0, 16, "ELF identification")
    if ident[:4] != b"\x7fELF":
        raise ElfLoadError("not an ELF object (bad magic)")
    if ident[4] != 2 or ident[5] != 1:
        raise ElfLoadError("not a 64-bit little-endian ELF object")
    e_type, e_machine = r.unpack("<HH", 16, "ELF header")
    if e_type != 1:
        raise ElfLoadError(f"ELF type {e_type} is not a relocatable object (ET_REL)")
    if e_machine != 62:
        raise ElfLoadError(f"ELF machine {e_machine} is not x86-64")
    (shoff,) = r.unpack("<Q", 40, "ELF header")
    shentsize, shnum, shstrndx = r.unpack("<HHH", 58, "ELF header")
    if shentsize != 64 or shnum == 0 or shstrndx >= shnum:
        raise ElfLoadError(f"unsupported section header table (entry size {shentsize}, "
                           f"{shnum} sections, names in {shstrndx})")
    sections, name_offsets = [], []
    for i in range(shnum):
        name, typ, flags, _addr, off, size, link, info, align, entsize = r.unpack(
            "<IIQQQQIIQQ", shoff + 64 * i, f"section header {i}")
        sections.append(Section(i, "", typ, flags, off, size, link, info, max(align, 1), entsize))
        name_offsets.append(name)
        if typ != SHT_NOBITS:
            r.bytes(off, size, f"section {i}")  # bounds check
    for s, name in zip(sections[1:], name_offsets[1:]):
        s.name = r.cstring(sections[shstrndx], name)
    return sections


def _loaded(s: Section) -> bool:
    """Allocatable sections are mapped; unwind tables are skipped (nothing unwinds through
    generated code: it never throws and is never profiled with frame info)."""
    if not s.flags & SHF_ALLOC or s.type == SHT_X86_64_UNWIND or s.name == ".eh_frame":
        return False
    if s.flags & SHF_TLS:
        raise ElfLoadError(f"thread-local section {s.name} is not supported")
    if s.type in (SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY) or s.name.startswith((".ctors", ".dtors")):
        raise ElfLoadError(f"section {s.name} needs constructors or destructors run; not supported")
    return True


def _parse_symbols(r: _Reader, sections: list[Section]) -> list[Symbol]:
    tables = [s for s in sections if s.type == SHT_SYMTAB]
    if len(tables) != 1:
        raise ElfLoadError(f"expected one symbol table, found {len(tables)}")
    tab = tables[0]
    if tab.link >= len(sections):
        raise ElfLoadError("symbol table names a missing string table")
    names = sections[tab.link]
    symbols = []
    for k in range(tab.size // 24):
        name, info, _other, shndx, value, _size = r.unpack("<IBBHQQ", tab.offset + 24 * k, f"symbol {k}")
        symbols.append(Symbol(r.cstring(names, name), info >> 4, info & 0xF, shndx, value))
    return symbols


class NativeObject:
    """An object file loaded into this process; `address(name)` gives its global symbols.
    The memory stays valid until `close()` (or garbage collection) of this object."""

    def __init__(self, object_code: bytes):
        self._base: int | None = None
        r = _Reader(bytes(object_code))
        sections = _parse_sections(r)
        symbols = _parse_symbols(r, sections)
        relocs = self._parse_relocations(r, sections, symbols)
        externals = sorted({symbols[sym].name for _, _, typ, sym, _ in relocs
                            if symbols[sym].shndx == SHN_UNDEF and typ != R_NONE})
        weak = {s.name for s in symbols if s.shndx == SHN_UNDEF and s.bind == STB_WEAK}
        self._ext_addr = {}
        for name in externals:
            addr = resolve_external(name)
            if addr is None and name not in weak:  # an absent weak symbol is address 0
                raise ElfLoadError(f"undefined symbol {name!r} is not in this process")
            self._ext_addr[name] = addr or 0
        got_symbols = sorted({sym for _, _, typ, sym, _ in relocs if typ in GOT_RELOCS})
        self._layout(sections, externals, got_symbols)
        # absolute 32-bit relocations (non-PIC code) need the image in the low 2 GB
        self._map(low=any(typ in (R_32, R_32S) for _, _, typ, _, _ in relocs))
        try:
            image = bytearray(self.size)
            for s in sections:
                if s.loaded and s.type != SHT_NOBITS:
                    at = s.address - self._base
                    image[at:at + s.size] = r.data[s.offset:s.offset + s.size]
            addr = self._symbol_addresses(sections, symbols)
            self._fill_stubs(image)
            for target, offset, typ, sym, addend in relocs:
                self._apply(image, sections[target], offset, typ, sym, symbols[sym], addr[sym], addend)
            ctypes.memmove(self._base, (ctypes.c_char * self.size).from_buffer(image), self.size)
            self._protect()
        except BaseException:
            self.close()
            raise
        self.symbols = {sym.name: addr[k] for k, sym in enumerate(symbols)
                        if sym.bind in (STB_GLOBAL, STB_WEAK) and sym.shndx != SHN_UNDEF
                        and sym.name and addr[k] is not None}

    # ---- parsing ---------------------------------------------------------------------------

    @staticmethod
    def _parse_relocations(r: _Reader, sections: list[Section], symbols: list[Symbol]) -> list[tuple]:
        """(target section, offset, type, symbol index, addend) for relocations of loaded
        sections; checks types and bounds here so nothing is mapped for a bad object."""
        out = []
        for rs in sections:
            if rs.type not in (SHT_RELA, SHT_REL) or rs.info >= len(sections):
                continue
            target = sections[rs.info]
            if not _loaded(target):
                continue
            if rs.type == SHT_REL:
                raise ElfLoadError(f"REL (no addend) relocations in {rs.name} are not supported")
            if target.type == SHT_NOBITS:
                raise ElfLoadError(f"relocations against the uninitialised section {target.name}")
            for k in range(rs.size // 24):
                offset, info, addend = r.unpack("<QQq", rs.offset + 24 * k, f"relocation {k} of {rs.name}")
                typ, sym = info & 0xFFFFFFFF, info >> 32
                if sym >= len(symbols):
                    raise ElfLoadError(f"relocation {k} of {rs.name} names missing symbol {sym}")
                name = symbols[sym].name or f"#{sym}"
                if typ not in SUPPORTED:
                    raise ElfLoadError(f"unsupported relocation {R_NAMES.get(typ, f'type {typ}')} "
                                       f"against {name} in {target.name}")
                if offset + (8 if typ == R_64 else 4) > target.size:
                    raise ElfLoadError(f"relocation at {offset} is outside {target.name}")
                out.append((target.index, offset, typ, sym, addend))
        return out

    # ---- layout and mapping ----------------------------------------------------------------

    def _layout(self, sections: list[Section], externals: list[str], got_symbols: list[int]) -> None:
        """Three page-aligned regions: code (sections + jump stubs), constants (+ GOT), data."""
        regions = {"text": [], "rodata": [], "data": []}
        for s in sections:
            if _loaded(s):
                kind = "text" if s.flags & SHF_EXECINSTR else "data" if s.flags & SHF_WRITE else "rodata"
                regions[kind].append(s)
        pos = 0
        self._regions: list[tuple[int, int, int]] = []  # (offset, size, prot)
        for kind, prot in (("text", PROT_READ | PROT_EXEC), ("rodata", PROT_READ),
                           ("data", PROT_READ | PROT_WRITE)):
            start = pos
            for s in regions[kind]:
                pos = _align(pos, s.align)
                s.address, s.loaded = pos, True
                pos += s.size
            if kind == "text":
                pos = _align(pos, 16)
                self._stub_at = {n: pos + STUB_SIZE * i for i, n in enumerate(externals)}
                pos += STUB_SIZE * len(externals)
            if kind == "rodata":
                pos = _align(pos, 8)
                self._got_at = {k: pos + 8 * i for i, k in enumerate(got_symbols)}
                pos += 8 * len(got_symbols)
            pos = _align(pos, PAGE)
            if pos > start:
                self._regions.append((start, pos - start, prot))
        self.size = max(pos, PAGE)
        self._sections = [s for s in sections if s.loaded]

    def _map(self, low: bool) -> None:
        flags = MAP_PRIVATE | MAP_ANONYMOUS | (MAP_32BIT if low else 0)
        base = _libc().mmap(None, self.size, PROT_READ | PROT_WRITE, flags, -1, 0)
        if base in (None, MAP_FAILED):
            raise ElfLoadError(f"mmap of {self.size} bytes failed (errno {ctypes.get_errno()})")
        self._base = base
        for s in self._sections:
            s.address += base
        self._stub_at = {n: base + off for n, off in self._stub_at.items()}
        self._got_at = {k: base + off for k, off in self._got_at.items()}

    def _protect(self) -> None:
        for offset, size, prot in self._regions:
            if _libc().mprotect(self._base + offset, size, prot) != 0:
                raise ElfLoadError(f"mprotect failed (errno {ctypes.get_errno()})")

    @property
    def regions(self) -> list[tuple[int, int, str]]:
        """(start, end, 'r-x' style permissions) of each mapped region, for checks."""
        def perms(p: int) -> str:
            return ("r" if p & PROT_READ else "-") + ("w" if p & PROT_WRITE else "-") + ("x" if p & PROT_EXEC else "-")
        return [(self._base + o, self._base + o + n, perms(p)) for o, n, p in self._regions]

    # ---- symbols and relocations -----------------------------------------------------------

    def _symbol_addresses(self, sections: list[Section], symbols: list[Symbol]) -> list[int | None]:
        """Per symbol, its address; None where a relocation may not use it (checked there)."""
        out: list[int | None] = []
        for sym in symbols:
            if sym.shndx == SHN_UNDEF:
                out.append(self._ext_addr.get(sym.name))
            elif sym.shndx == SHN_ABS:
                out.append(sym.value)
            elif sym.shndx >= SHN_LORESERVE or sym.type == STT_TLS:
                out.append(None)
            elif sym.shndx < len(sections) and sections[sym.shndx].loaded:
                out.append(sections[sym.shndx].address + sym.value)
            else:
                out.append(None)
        return out

    def _fill_stubs(self, image: bytearray) -> None:
        """External functions (libc) are further than the ±2 GB a call can reach: calls go
        through a stub that jumps to the address stored right after it."""
        for name, at in self._stub_at.items():
            o = at - self._base
            image[o:o + STUB_SIZE] = STUB_CODE + struct.pack("<Q", self._ext_addr[name]) + b"\xcc\xcc"

    def _apply(self, image: bytearray, target: Section, offset: int, typ: int, index: int,
               sym: Symbol, s_addr: int | None, addend: int) -> None:
        if typ == R_NONE:
            return
        name = sym.name or f"section symbol of section {sym.shndx}"
        rname = R_NAMES[typ]
        if s_addr is None:
            raise ElfLoadError(f"{rname} against {name}, which is not loadable "
                               f"(section index {sym.shndx})")
        place = target.address + offset
        at = place - self._base
        if typ in GOT_RELOCS:
            got = self._got_at[index]
            struct.pack_into("<Q", image, got - self._base, s_addr)
            value = got + addend - place
        elif typ == R_PLT32 and sym.shndx == SHN_UNDEF:
            value = self._stub_at[sym.name] + addend - place
        elif typ in (R_PC32, R_PLT32):
            value = s_addr + addend - place
        elif typ == R_64:
            struct.pack_into("<Q", image, at, (s_addr + addend) & 0xFFFFFFFFFFFFFFFF)
            return
        elif typ == R_32:
            value = s_addr + addend
            if not 0 <= value < 1 << 32:
                raise ElfLoadError(f"{rname} against {name}: value {value:#x} does not fit 32 bits")
            struct.pack_into("<I", image, at, value)
            return
        else:  # R_32S
            value = s_addr + addend
        if not -(1 << 31) <= value < 1 << 31:
            raise ElfLoadError(f"{rname} against {name}: value {value:#x} out of the signed 32-bit range")
        struct.pack_into("<i", image, at, value)

    # ---- public ----------------------------------------------------------------------------

    def address(self, name: str) -> int:
        if self._base is None:
            raise ValueError("the object has been closed")
        try:
            return self.symbols[name]
        except KeyError:
            raise KeyError(f"function {name} not found in the loaded object") from None

    def close(self) -> None:
        """Unmap the object: no code of it may run afterwards."""
        if self._base is not None:
            _libc().munmap(self._base, self.size)
            self._base = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
