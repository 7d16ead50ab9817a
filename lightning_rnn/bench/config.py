"""The benchmark's configuration: one dataclass per section, one YAML file per preset.

``conf/bench/*.yaml`` maps one-to-one onto :class:`BenchConfig` (``_target_`` names it,
so ``hydra.utils.instantiate(cfg.bench)`` builds one); :func:`BenchConfig.from_any`
accepts a DictConfig, a plain mapping or a BenchConfig. Every value is checked here,
and a bad one raises ``ValueError`` naming its key (e.g. ``bench.grid.hidden``).

Sizes are in elements (hidden units, time steps, sequences); times are in seconds
internally and milliseconds in reports; memory is in bytes internally, MiB in reports.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from .implementations import parse_impl
from .validators import (
    choices, flag, from_mapping, implementation_names, integer, integers, non_empty_list, number_in, optional_integer,
    section,
)

CELLS = ("lstm", "gru")


# ----- sections (their values checked by .validators) ----------------------------------
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
        self.enabled = flag(f"{k}.enabled", self.enabled)
        self.cells = choices(f"{k}.cells", self.cells, CELLS)
        self.implementations = implementation_names(f"{k}.implementations", self.implementations)
        self.batch = integer(f"{k}.batch", self.batch)
        self.seq_len = integer(f"{k}.seq_len", self.seq_len)
        self.layers = integers(f"{k}.layers", self.layers)
        self.hidden = integers(f"{k}.hidden", self.hidden)
        self.input_size = optional_integer(f"{k}.input_size", self.input_size)


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
        self.enabled = flag(f"{k}.enabled", self.enabled)
        self.cells = choices(f"{k}.cells", self.cells, CELLS)
        self.implementations = implementation_names(f"{k}.implementations", self.implementations, packed=True)
        self.batch = integer(f"{k}.batch", self.batch)
        self.seq_len = integer(f"{k}.seq_len", self.seq_len)
        self.layers = integers(f"{k}.layers", self.layers)
        self.hidden = integers(f"{k}.hidden", self.hidden)
        self.fill = number_in(f"{k}.fill", self.fill, 0.0, 1.0)


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
        self.enabled = flag(f"{k}.enabled", self.enabled)
        self.cells = choices(f"{k}.cells", self.cells, CELLS)
        self.implementations = implementation_names(f"{k}.implementations", self.implementations)
        self.batch = integer(f"{k}.batch", self.batch)
        self.layers = integer(f"{k}.layers", self.layers)
        self.seq_lens = integers(f"{k}.seq_lens", self.seq_lens)
        self.hidden = integers(f"{k}.hidden", self.hidden)
        self.rounds = integer(f"{k}.rounds", self.rounds)
        self.warmup = integer(f"{k}.warmup", self.warmup, minimum=0)


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
        self.cells = choices(f"{k}.cells", self.cells, ("lstm",))
        self.implementations = implementation_names(f"{k}.implementations", self.implementations, projected=True)
        self.proj_sizes = integers(f"{k}.proj_sizes", self.proj_sizes)


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
        self.enabled = flag(f"{k}.enabled", self.enabled)
        self.cells = choices(f"{k}.cells", self.cells, CELLS)
        self.implementations = implementation_names(f"{k}.implementations", self.implementations)
        for i, name in enumerate(self.implementations):
            spec = parse_impl(name)
            if spec.base not in ("ours", "torch") or spec.modifiers:
                raise ValueError(f"{k}.implementations[{i}]: expected 'ours', 'ours:<backend>' or 'torch', "
                                 f"got {name!r}")
        self.batch = integer(f"{k}.batch", self.batch)
        self.seq_len = integer(f"{k}.seq_len", self.seq_len)
        self.layers = integers(f"{k}.layers", self.layers)
        self.hidden = integers(f"{k}.hidden", self.hidden)
        self.steps = integer(f"{k}.steps", self.steps)
        self.warmup = integer(f"{k}.warmup", self.warmup, minimum=0)
        self.pairs = integer(f"{k}.pairs", self.pairs)
        self.input_grad = flag(f"{k}.input_grad", self.input_grad)


@dataclass
class CallbacksConfig:
    """The callbacks' own studies (:mod:`lightning_rnn.bench.callbacks_bench`), each if it exists."""

    enabled: bool = True
    checkpoint_vs_naive: bool = True  # 3x512: memory (saved, peak) vs the naive loop, time vs plain
    checkpoint_scaling: bool = True  # saved bytes vs T up to 10,000 with chunk_size="sqrt"
    packed_epoch: bool = True  # an epoch with vs without PackedSequences, lengths U[10, 500]

    def __post_init__(self):
        for name in ("enabled", "checkpoint_vs_naive", "checkpoint_scaling", "packed_epoch"):
            setattr(self, name, flag(f"bench.callbacks.{name}", getattr(self, name)))


GENERATORS = ("compiled", "compiled_bf16", "fused_loop", "plain")


@dataclass
class GenerationConfig:
    """Characters per second of a character LM's sampling at batch 1 (:mod:`.generation`):
    the compiled loop with float32 and bfloat16 weights, Python loops over steps of the fused
    layer and of torch.nn's, and the weight-bandwidth bound."""

    enabled: bool = True
    cells: list[str] = field(default_factory=lambda: ["lstm"])
    implementations: list[str] = field(default_factory=lambda: list(GENERATORS))
    models: list[list[int]] = field(default_factory=lambda: [[2, 128], [3, 512]])  # [layers, hidden] each
    embedding_dim: int = 64
    vocab: int = 96
    length: int = 200  # characters per timed call
    threads: int | None = 1  # the section's torch threads; null: the run's
    bandwidth_mb: int = 256  # the copy that measures memory bandwidth, in MiB: past every cache

    def __post_init__(self):
        k = "bench.generation"
        self.enabled = flag(f"{k}.enabled", self.enabled)
        self.cells = choices(f"{k}.cells", self.cells, CELLS)
        self.implementations = choices(f"{k}.implementations", self.implementations, GENERATORS)
        self.models = non_empty_list(f"{k}.models", self.models)
        for i, point in enumerate(self.models):
            if isinstance(point, (str, bytes)) or not isinstance(point, Sequence) or len(point) != 2:
                raise ValueError(f"{k}.models[{i}]: expected a pair [layers, hidden], got {point!r}")
            self.models[i] = integers(f"{k}.models[{i}]", point)
        self.embedding_dim = integer(f"{k}.embedding_dim", self.embedding_dim)
        self.vocab = integer(f"{k}.vocab", self.vocab, minimum=2)
        self.length = integer(f"{k}.length", self.length)
        self.threads = optional_integer(f"{k}.threads", self.threads)
        self.bandwidth_mb = integer(f"{k}.bandwidth_mb", self.bandwidth_mb)


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
    generation: GenerationConfig = field(default_factory=GenerationConfig)
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
        self.grid = section(GridConfig, "bench.grid", self.grid)
        self.varlen = section(VarlenConfig, "bench.varlen", self.varlen)
        self.scaling = section(ScalingConfig, "bench.scaling", self.scaling)
        self.features = section(FeaturesConfig, "bench.features", self.features)
        self.projection = section(ProjectionConfig, "bench.projection", self.projection)
        self.alone = section(AloneConfig, "bench.alone", self.alone)
        self.callbacks = section(CallbacksConfig, "bench.callbacks", self.callbacks)
        self.generation = section(GenerationConfig, "bench.generation", self.generation)
        self.checkpoint_chunk_size = optional_integer("bench.checkpoint_chunk_size", self.checkpoint_chunk_size)
        self.rounds = integer("bench.rounds", self.rounds)
        self.warmup = integer("bench.warmup", self.warmup, minimum=0)
        seconds = self.min_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            raise ValueError(f"bench.min_seconds: expected a number >= 0, got {seconds!r}")
        self.min_seconds = float(seconds)
        self.threads = optional_integer("bench.threads", self.threads)
        if not isinstance(self.device, str) or self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"bench.device: expected 'cpu' or 'cuda[:index]', got {self.device!r}")
        self.seed = integer("bench.seed", self.seed, minimum=0)
        if self.out_dir is not None and not isinstance(self.out_dir, (str, os.PathLike)):
            raise ValueError(f"bench.out_dir: expected a path or null, got {self.out_dir!r}")
        if self.page is not None and not (isinstance(self.page, (str, os.PathLike)) and str(self.page).endswith(".md")):
            raise ValueError(f"bench.page: expected the path of a Markdown (.md) file or null, got {self.page!r}")
        self.plots = flag("bench.plots", self.plots)
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
        return from_mapping(cls, "bench", cfg)


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
