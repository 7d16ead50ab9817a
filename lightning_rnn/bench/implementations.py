"""Names of the implementations the benchmark compares.

Grammar: ``base[:backend][+modifier...]``

- base ``ours`` (FusedLSTM/FusedGRU; ``:backend`` picks a kernel backend, default auto),
  ``torch`` (torch.nn), ``naive`` (a Python loop over LSTMCell/GRUCell), ``gemm`` (the
  GEMMs alone, the lower bound);
- modifier ``ckpt`` (ours only): gradient checkpointing, ``checkpoint_chunk_size`` set on
  the layer; ``bf16``: run under ``torch.autocast(dtype=torch.bfloat16)``.

Examples: ``ours``, ``ours:reference``, ``ours+ckpt``, ``ours+bf16``, ``torch+bf16``.
"""
from __future__ import annotations

from dataclasses import dataclass

BASES = ("ours", "torch", "naive", "gemm")
BACKENDS = ("auto", "reference", "cpp", "cuda")
MODIFIERS = ("ckpt", "bf16")


@dataclass(frozen=True)
class ImplSpec:
    name: str
    base: str
    backend: str  # ours only; "" otherwise
    modifiers: tuple[str, ...]

    @property
    def is_ours(self) -> bool:
        return self.base == "ours"

    @property
    def plain(self) -> str:
        """The name without modifiers: what a modified implementation is compared against."""
        return self.name.split("+")[0]


def parse_impl(name: object, key: str = "implementations") -> ImplSpec:
    """Parse an implementation name; ValueError naming ``key`` if it is not valid."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{key}: expected an implementation name like 'ours' or 'torch', got {name!r}")
    head, *modifiers = name.split("+")
    base, _, backend = head.partition(":")
    if base not in BASES:
        raise ValueError(f"{key}: unknown implementation {name!r} (bases: {', '.join(BASES)})")
    if backend and (base != "ours" or backend not in BACKENDS):
        raise ValueError(f"{key}: {name!r}: only 'ours' takes a backend, one of {', '.join(BACKENDS)}")
    for m in modifiers:
        if m not in MODIFIERS:
            raise ValueError(f"{key}: {name!r}: unknown modifier {m!r} (modifiers: {', '.join(MODIFIERS)})")
        if m == "ckpt" and base != "ours":
            raise ValueError(f"{key}: {name!r}: '+ckpt' applies to 'ours' only")
    if len(set(modifiers)) != len(modifiers):
        raise ValueError(f"{key}: {name!r}: repeated modifier")
    return ImplSpec(name, base, backend or ("auto" if base == "ours" else ""), tuple(modifiers))
