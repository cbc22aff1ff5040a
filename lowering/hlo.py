"""What XLA compiles a program to, as a digest: two programs are the same executable exactly when their digests are
equal. superopt calls a changed program "optimized" only where its executable differs from the original's
(pipeline: a candidate XLA compiles to the original's executable is kept as the original, unverified), and the
benchmarks count a kernel changed the same way."""
from __future__ import annotations

import hashlib
import re

_METADATA = re.compile(r',?\s*metadata=\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')
_COMMENT = re.compile(r"/\*.*?\*/")
_REFERENCE = re.compile(r"%([\w.\-]+)")
_PARAMETER = re.compile(r"([(,]\s*)[\w.\-]+: ")
_HEADER = re.compile(r"^(ENTRY )?%([\w.\-]+) (.*) \{$")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.*)$")


def executable(jitted, args) -> str:
    """A digest of the optimized HLO that XLA compiles `jitted` (anything with jax.jit's `.lower`) to for
    `args`, blind to what does not change the program: the module's name and source-location tables, op
    metadata, the names of instructions, computations and parameters, and the order of independent
    instructions (each instruction is digested from its text with every operand and called computation
    replaced by that one's digest). Two callables compile to the same executable exactly when these are equal."""
    return compiled_digest(jitted.lower(*args))


def compiled_digest(lowered) -> str:
    """`executable`'s digest of a lowered program (what jax.jit's `.lower` returns), compiled here."""
    return hlo_digest(lowered.compile().as_text())


def hlo_digest(text: str) -> str:
    """`executable`'s digest of an HLO module's text: its entry computation's."""
    def digest(s: str) -> str:
        return hashlib.sha1(s.encode()).hexdigest()[:16]

    text = _COMMENT.sub("", _METADATA.sub("", text))
    done: dict[str, str] = {}          # computation name -> digest (callees are printed before callers)
    entry, current = None, None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = dict(name=header.group(2), entry=bool(header.group(1)), root="", body=[], local={},
                           signature=_PARAMETER.sub(r"\1", header.group(3)))
            continue
        if current is None:
            continue
        if line.strip() == "}":
            key = digest("\n".join([current["signature"], current["root"], *sorted(current["body"])]))
            done[current["name"]] = key
            entry = key if current["entry"] else entry
            current = None
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction:
            local = current["local"]
            rest = _REFERENCE.sub(lambda m: "%" + local.get(m.group(1), done.get(m.group(1), m.group(1))),
                                  instruction.group(3))
            local[instruction.group(2)] = key = digest(rest)
            current["body"].append(key)
            if instruction.group(1):
                current["root"] = key
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return entry
