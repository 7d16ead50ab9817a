"""The benchmark's configuration: one dataclass per section, one YAML file per preset.

``conf/bench/*.yaml`` maps one-to-one onto :class:`BenchConfig` (``_target_`` names it,
so ``hydra.utils.instantiate(cfg.bench)`` builds one); :func:`BenchConfig.from_any`
accepts a DictConfig, a plain mapping or a BenchConfig. Every value is checked here,
and a bad one raises ``ValueError`` naming its key (e.g. ``bench.grid.hidden``).

Sizes are in elements (hidden units, time steps, sequences); times are in seconds
internally and milliseconds in reports; memory is in bytes internally, MiB in reports.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .implementations import parse_impl

CELLS = ("lstm", "gru")


# ----- validators (each raises ValueError naming the key) ------------------------------
def _int(key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key}: expected an int >= {minimum}, got {value!r}")
    return value


def _optional_int(key: str, value: Any, minimum: int = 1) -> int | None:
    return None if value is None else _int(key, value, minimum)


def _float(key: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
        raise ValueError(f"{key}: expected a number in ({low}, {high}], got {value!r}")
    return float(value)


def _ints(key: str, value: Any, minimum: int = 1) -> list[int]:
    items = _list(key, value)
    return [_int(f"{key}[{i}]", v, minimum) for i, v in enumerate(items)]


def _choices(key: str, value: Any, allowed: Sequence[str]) -> list[str]:
    items = _list(key, value)
    for i, v in enumerate(items):
        if v not in allowed:
            raise ValueError(f"{key}[{i}]: expected one of {', '.join(allowed)}, got {v!r}")
    if len(set(items)) != len(items):
        raise ValueError(f"{key}: duplicate entries in {items!r}")
    return list(items)


def _implementations(key: str, value: Any, *, packed: bool = False, projected: bool = False) -> list[str]:
    """A list of implementation names (see :mod:`lightning_rnn.bench.implementations`)."""
    items = _list(key, value)
    for i, name in enumerate(items):
        spec = parse_impl(name, f"{key}[{i}]")
        if packed and spec.base == "naive":
            raise ValueError(f"{key}[{i}]: 'naive' cannot run packed (variable-length) batches")
        if projected and spec.base in ("naive", "gemm"):
            raise ValueError(f"{key}[{i}]: {spec.base!r} has no projection (proj_size); use ours or torch")
    if len(set(items)) != len(items):
        raise ValueError(f"{key}: duplicate entries in {items!r}")
    return items


def _list(key: str, value: Any) -> list:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
        raise ValueError(f"{key}: expected a non-empty list, got {value!r}")
    return list(value)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key}: expected true or false, got {value!r}")
    return value


def _from_mapping(cls, key: str, values: Mapping):
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys by name."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names - {"_target_"})
    if unknown:
        raise ValueError(f"{key}.{unknown[0]}: unknown key (expected one of {', '.join(sorted(names))})")
    return cls(**{k: v for k, v in values.items() if k != "_target_"})


def _section(cls, key: str, value: Any):
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return _from_mapping(cls, key, value)
    raise ValueError(f"{key}: expected a mapping, got {value!r}")


# ----- sections -----------------------------------------------------------------------
@dataclass
class GridConfig:
    """torch-rnn's grid: every (cell, layers, hidden) point, each implementation, fwd+bwd."""

    enabled: bool = True
    cells: list[str] = field(default_factory=lambda: ["lstm", "gru"])
    implementations: list[str] = field(default_factory=lambda: ["ours", "torch", "naive", "gemm"])
    batch: int = 50
    seq_len: int = 50
    layers: list[int] = field(default_factory=lambda: [1, 2, 3])
    hidden: list[int] = field(default_factory=lambda: [64, 128, 256, 512])
    input_size: int | None = None  # None: input size = hidden size, as in torch-rnn
    _key: ClassVar[str] = "bench.grid"

    def __post_init__(self):
        k = self._key
        self.enabled = _bool(f"{k}.enabled", self.enabled)
        self.cells = _choices(f"{k}.cells", self.cells, CELLS)
        self.implementations = _implementations(f"{k}.implementations", self.implementations)
        self.batch = _int(f"{k}.batch", self.batch)
        self.seq_len = _int(f"{k}.seq_len", self.seq_len)
        self.layers = _ints(f"{k}.layers", self.layers)
        self.hidden = _ints(f"{k}.hidden", self.hidden)
        self.input_size = _optional_int(f"{k}.input_size", self.input_size)


@dataclass
class VarlenConfig:
    """Variable lengths: packed vs the same batch fully padded, ours and torch.nn."""

    enabled: bool = True
    cells: list[str] = field(default_factory=lambda: ["lstm", "gru"])
    implementations: list[str] = field(default_factory=lambda: ["ours", "torch"])
    batch: int = 50
    seq_len: int = 50  # the longest sequence = the padded length
    layers: list[int] = field(default_factory=lambda: [1])
    hidden: list[int] = field(default_factory=lambda: [128, 512])
    fill: float = 0.55  # real tokens / padded tokens

    def __post_init__(self):
        k = "bench.varlen"
        self.enabled = _bool(f"{k}.enabled", self.enabled)
        self.cells = _choices(f"{k}.cells", self.cells, CELLS)
        self.implementations = _implementations(f"{k}.implementations", self.implementations, packed=True)
        self.batch = _int(f"{k}.batch", self.batch)
        self.seq_len = _int(f"{k}.seq_len", self.seq_len)
        self.layers = _ints(f"{k}.layers", self.layers)
        self.hidden = _ints(f"{k}.hidden", self.hidden)
        self.fill = _float(f"{k}.fill", self.fill, 0.0, 1.0)


@dataclass
class ScalingConfig:
    """Cost in T: time and activation memory for long sequences and wide layers."""

    enabled: bool = True
    cells: list[str] = field(default_factory=lambda: ["lstm"])
    implementations: list[str] = field(default_factory=lambda: ["ours", "torch"])
    batch: int = 4  # small: T = 2000 at hidden 1024 is 8,000 tokens
    layers: int = 1
    seq_lens: list[int] = field(default_factory=lambda: [50, 200, 500, 1000, 2000])
    hidden: list[int] = field(default_factory=lambda: [256, 1024])
    rounds: int = 2  # long points: fewer rounds than the grid
    warmup: int = 1

    def __post_init__(self):
        k = "bench.scaling"
        self.enabled = _bool(f"{k}.enabled", self.enabled)
        self.cells = _choices(f"{k}.cells", self.cells, CELLS)
        self.implementations = _implementations(f"{k}.implementations", self.implementations)
        self.batch = _int(f"{k}.batch", self.batch)
        self.layers = _int(f"{k}.layers", self.layers)
        self.seq_lens = _ints(f"{k}.seq_lens", self.seq_lens)
        self.hidden = _ints(f"{k}.hidden", self.hidden)
        self.rounds = _int(f"{k}.rounds", self.rounds)
        self.warmup = _int(f"{k}.warmup", self.warmup, minimum=0)


@dataclass
class FeaturesConfig(GridConfig):
    """Training features on one point (torch-rnn's largest): gradient checkpointing, bf16.

    The same fields as the grid. Implementations whose feature the layers do not have
    yet (``ours+ckpt`` before ``checkpoint_chunk_size`` exists) are skipped with a note.
    """

    _key: ClassVar[str] = "bench.features"
    cells: list[str] = field(default_factory=lambda: ["lstm"])
    implementations: list[str] = field(default_factory=lambda: ["ours", "ours+ckpt", "ours+bf16", "torch", "naive"])
    layers: list[int] = field(default_factory=lambda: [3])
    hidden: list[int] = field(default_factory=lambda: [512])


@dataclass
class ProjectionConfig(GridConfig):
    """torch.nn.LSTM's ``proj_size``: ours vs torch.nn at each (layers, hidden, proj_size)
    point with proj_size < hidden (other fields as the grid; LSTM only: torch.nn.GRU has none)."""

    _key: ClassVar[str] = "bench.projection"
    cells: list[str] = field(default_factory=lambda: ["lstm"])
    implementations: list[str] = field(default_factory=lambda: ["ours", "torch"])
    layers: list[int] = field(default_factory=lambda: [1, 2])
    hidden: list[int] = field(default_factory=lambda: [256, 512, 1024])
    proj_sizes: list[int] = field(default_factory=lambda: [64, 256])

    def __post_init__(self):
        super().__post_init__()
        k = self._key
        self.cells = _choices(f"{k}.cells", self.cells, ("lstm",))
        self.implementations = _implementations(f"{k}.implementations", self.implementations, projected=True)
        self.proj_sizes = _ints(f"{k}.proj_sizes", self.proj_sizes)


@dataclass
class AloneConfig:
    """A training step (forward, backward, Adam step) of each implementation in processes
    of its own (:mod:`lightning_rnn.bench.alone`): ours and torch.nn only, no modifiers."""

    enabled: bool = True
    cells: list[str] = field(default_factory=lambda: ["lstm", "gru"])
    implementations: list[str] = field(default_factory=lambda: ["ours", "torch"])
    batch: int = 50
    seq_len: int = 50
    layers: list[int] = field(default_factory=lambda: [1])
    hidden: list[int] = field(default_factory=lambda: [64, 128, 256, 512])
    steps: int = 20  # timed steps per process
    warmup: int = 5  # untimed steps first
    pairs: int = 3  # pairs of processes per implementation, alternating
    input_grad: bool = True  # the input requires grad (dx computed), as in the grid

    def __post_init__(self):
        k = "bench.alone"
        self.enabled = _bool(f"{k}.enabled", self.enabled)
        self.cells = _choices(f"{k}.cells", self.cells, CELLS)
        self.implementations = _implementations(f"{k}.implementations", self.implementations)
        for i, name in enumerate(self.implementations):
            spec = parse_impl(name)
            if spec.base not in ("ours", "torch") or spec.modifiers:
                raise ValueError(f"{k}.implementations[{i}]: expected 'ours', 'ours:<backend>' or 'torch', "
                                 f"got {name!r}")
        self.batch = _int(f"{k}.batch", self.batch)
        self.seq_len = _int(f"{k}.seq_len", self.seq_len)
        self.layers = _ints(f"{k}.layers", self.layers)
        self.hidden = _ints(f"{k}.hidden", self.hidden)
        self.steps = _int(f"{k}.steps", self.steps)
        self.warmup = _int(f"{k}.warmup", self.warmup, minimum=0)
        self.pairs = _int(f"{k}.pairs", self.pairs)
        self.input_grad = _bool(f"{k}.input_grad", self.input_grad)


@dataclass
class CallbacksConfig:
    """The callbacks' own studies (:mod:`lightning_rnn.bench.callbacks_bench`), each if it exists."""

    enabled: bool = True
    checkpoint_vs_naive: bool = True  # 3x512: memory (saved, peak) vs the naive loop, time vs plain
    checkpoint_scaling: bool = True  # saved bytes vs T up to 10,000 with chunk_size="sqrt"
    packed_epoch: bool = True  # an epoch with vs without PackedSequences, lengths U[10, 500]

    def __post_init__(self):
        for name in ("enabled", "checkpoint_vs_naive", "checkpoint_scaling", "packed_epoch"):
            setattr(self, name, _bool(f"bench.callbacks.{name}", getattr(self, name)))


@dataclass
class BenchConfig:
    """Everything ``lightning_rnn.bench.main`` needs; ``conf/bench/default.yaml`` mirrors it."""

    grid: GridConfig = field(default_factory=GridConfig)
    varlen: VarlenConfig = field(default_factory=VarlenConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    projection: ProjectionConfig = field(default_factory=ProjectionConfig)
    alone: AloneConfig = field(default_factory=AloneConfig)
    callbacks: CallbacksConfig = field(default_factory=CallbacksConfig)
    checkpoint_chunk_size: int | None = None  # for '+ckpt' implementations; None: the layer's "sqrt"
    rounds: int = 9  # timed rounds; each implementation runs once per round
    warmup: int = 2  # untimed rounds first
    min_seconds: float = 0.0  # more timed rounds than `rounds` until a point's rounds took this long
    threads: int | None = None  # torch.set_num_threads for the whole run; None: all cores
    device: str = "cpu"
    seed: int = 0
    out_dir: str | None = None  # None: <hydra run dir>/bench under Hydra, else ./bench_results
    page: str | None = None  # a Markdown page rebuilt from every result folder next to out_dir; None: none
    plots: bool = True
    table: str = "auto"  # how to print tables: auto (rich if installed), rich, plain, none
    note: str | None = None  # a line printed first and put in every table's header

    def __post_init__(self):
        self.grid = _section(GridConfig, "bench.grid", self.grid)
        self.varlen = _section(VarlenConfig, "bench.varlen", self.varlen)
        self.scaling = _section(ScalingConfig, "bench.scaling", self.scaling)
        self.features = _section(FeaturesConfig, "bench.features", self.features)
        self.projection = _section(ProjectionConfig, "bench.projection", self.projection)
        self.alone = _section(AloneConfig, "bench.alone", self.alone)
        self.callbacks = _section(CallbacksConfig, "bench.callbacks", self.callbacks)
        self.checkpoint_chunk_size = _optional_int("bench.checkpoint_chunk_size", self.checkpoint_chunk_size)
        self.rounds = _int("bench.rounds", self.rounds)
        self.warmup = _int("bench.warmup", self.warmup, minimum=0)
        seconds = self.min_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            raise ValueError(f"bench.min_seconds: expected a number >= 0, got {seconds!r}")
        self.min_seconds = float(seconds)
        self.threads = _optional_int("bench.threads", self.threads)
        if not isinstance(self.device, str) or self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"bench.device: expected 'cpu' or 'cuda[:index]', got {self.device!r}")
        self.seed = _int("bench.seed", self.seed, minimum=0)
        if self.out_dir is not None and not isinstance(self.out_dir, (str, os.PathLike)):
            raise ValueError(f"bench.out_dir: expected a path or null, got {self.out_dir!r}")
        if self.page is not None and not (isinstance(self.page, (str, os.PathLike)) and str(self.page).endswith(".md")):
            raise ValueError(f"bench.page: expected the path of a Markdown (.md) file or null, got {self.page!r}")
        self.plots = _bool("bench.plots", self.plots)
        if self.table not in ("auto", "rich", "plain", "none"):
            raise ValueError(f"bench.table: expected one of auto, rich, plain, none, got {self.table!r}")
        if self.note is not None and not isinstance(self.note, str):
            raise ValueError(f"bench.note: expected a string or null, got {self.note!r}")

    @classmethod
    def from_any(cls, cfg: "BenchConfig | Mapping | None" = None) -> "BenchConfig":
        """A BenchConfig from a DictConfig (e.g. Hydra's ``cfg.bench``), a mapping, or None (defaults)."""
        if cfg is None:
            return cls()
        if isinstance(cfg, cls):
            return cfg
        try:
            from omegaconf import DictConfig, OmegaConf

            if isinstance(cfg, DictConfig):
                cfg = OmegaConf.to_container(cfg, resolve=True)
        except ImportError:  # omegaconf is a dependency of hydra-core; plain mappings still work
            pass
        if not isinstance(cfg, Mapping):
            raise ValueError(f"bench: expected a mapping or a BenchConfig, got {type(cfg).__name__}")
        return _from_mapping(cls, "bench", cfg)


# ----- presets (conf/bench/*.yaml) ----------------------------------------------------------
def conf_dir() -> Path:
    """``bench/`` of the packaged configs (``lightning_rnn/_conf``) if built, else of ``conf/``."""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "_conf" / "bench"
    return packaged if packaged.is_dir() else package.parent / "conf" / "bench"


def load_preset(name: str, overrides: Sequence[str] = ()) -> BenchConfig:
    """``conf/bench/<name>.yaml`` (with its defaults list) plus ``key=value`` overrides."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(_load_yaml(name, set()), OmegaConf.from_dotlist(list(overrides)))
    return BenchConfig.from_any(cfg)


def _load_yaml(name: str, seen: set[str]):
    """One preset, resolving a Hydra-style ``defaults`` list of sibling presets."""
    from omegaconf import OmegaConf

    path = conf_dir() / f"{name}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in conf_dir().glob("*.yaml"))
        raise ValueError(f"preset: no {path} (available: {', '.join(available) or 'none'})")
    if name in seen:
        raise ValueError(f"preset: defaults cycle through {name!r}")
    raw = OmegaConf.load(path)
    defaults = list(raw.pop("defaults", ["_self_"]))
    if "_self_" not in defaults:
        defaults.append("_self_")
    merged = OmegaConf.create()
    for entry in defaults:
        part = raw if entry == "_self_" else _load_yaml(str(entry), seen | {name})
        merged = OmegaConf.merge(merged, part)
    return merged
