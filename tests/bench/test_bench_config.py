"""The benchmark's configuration: presets, validation, the Hydra path."""
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lightning_rnn.bench.config import BenchConfig, conf_dir, load_preset
from lightning_rnn.bench.harness import bench_node
from lightning_rnn.bench.implementations import parse_impl


def test_default_yaml_mirrors_the_dataclass_defaults():
    assert load_preset("default") == BenchConfig()


@pytest.mark.parametrize("preset", ["smoke", "full"])
def test_presets_load_and_override(preset):
    cfg = load_preset(preset, ["grid.hidden=[32]", "threads=1"])
    assert cfg.grid.hidden == [32] and cfg.threads == 1


@pytest.mark.parametrize(
    "values, key",
    [
        ({"grid": {"hidden": [64, 0]}}, "bench.grid.hidden[1]"),
        ({"grid": {"cells": ["rnn"]}}, "bench.grid.cells[0]"),
        ({"grid": {"implementations": ["ours", "cudnn"]}}, "bench.grid.implementations[1]"),
        ({"grid": {"implementations": ["torch+ckpt"]}}, "bench.grid.implementations[0]"),
        ({"varlen": {"implementations": ["naive"]}}, "bench.varlen.implementations[0]"),
        ({"varlen": {"fill": 1.5}}, "bench.varlen.fill"),
        ({"projection": {"implementations": ["ours", "naive"]}}, "bench.projection.implementations[1]"),
        ({"projection": {"cells": ["gru"]}}, "bench.projection.cells[0]"),
        ({"projection": {"proj_sizes": [0]}}, "bench.projection.proj_sizes[0]"),
        ({"scaling": {"seq_lens": []}}, "bench.scaling.seq_lens"),
        ({"alone": {"implementations": ["ours", "naive"]}}, "bench.alone.implementations[1]"),
        ({"alone": {"implementations": ["ours+ckpt"]}}, "bench.alone.implementations[0]"),
        ({"alone": {"pairs": 0}}, "bench.alone.pairs"),
        ({"alone": {"input_grad": "yes"}}, "bench.alone.input_grad"),
        ({"generation": {"implementations": ["compiled", "sample"]}}, "bench.generation.implementations[1]"),
        ({"generation": {"models": [[2, 128], [3]]}}, "bench.generation.models[1]"),
        ({"generation": {"models": [[2, 0]]}}, "bench.generation.models[0][1]"),
        ({"generation": {"vocab": 1}}, "bench.generation.vocab"),
        ({"generation": {"threads": 0}}, "bench.generation.threads"),
        ({"rounds": 0}, "bench.rounds"),
        ({"min_seconds": -1}, "bench.min_seconds"),
        ({"min_seconds": "10s"}, "bench.min_seconds"),
        ({"threads": "all"}, "bench.threads"),
        ({"device": "tpu"}, "bench.device"),
        ({"table": "html"}, "bench.table"),
        ({"grid": {"hiden": [64]}}, "bench.grid.hiden"),
        ({"grid": [64]}, "bench.grid"),
    ],
)
def test_bad_values_raise_naming_the_key(values, key):
    with pytest.raises(ValueError, match="^" + re.escape(key) + ":"):
        BenchConfig.from_any(values)


def test_implementation_names():
    spec = parse_impl("ours:reference+ckpt")
    assert (spec.base, spec.backend, spec.modifiers, spec.plain) == ("ours", "reference", ("ckpt",), "ours:reference")
    assert parse_impl("torch+bf16").modifiers == ("bf16",) and parse_impl("ours").backend == "auto"
    with pytest.raises(ValueError, match="only 'ours' takes a backend"):
        parse_impl("torch:cpp")


def test_main_finds_the_bench_node_of_the_app_config():
    bench = {"rounds": 3}
    assert bench_node({"task": {}, "bench": bench}) is bench
    assert bench_node({"task": {}, "seed": 1}) is None  # the app config without a bench group
    assert bench_node(bench) is bench


@pytest.mark.parametrize(("device", "gpus", "expected"), [("cuda", 0, "CUDA is not available"),
                                                         ("cuda:1", 1, "has 1 CUDA device")])
def test_main_refuses_a_missing_cuda_device_before_running(monkeypatch, tmp_path, device, gpus, expected):
    """bench.device=cuda where there is no such GPU: a ValueError naming the key, before any
    section runs or writes (not a CUDA assertion from the first section or a worker)."""
    import torch

    from lightning_rnn.bench.harness import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    with pytest.raises(ValueError, match=rf"bench.device: '{device}', but .*{expected}"):
        main({"device": device, "out_dir": str(tmp_path / "out")}, log=lambda line: None)
    assert not (tmp_path / "out").exists()


def _compose_app(overrides):
    root = str(Path(conf_dir()).parent)
    with initialize_config_dir(config_dir=root, version_base="1.3"):
        try:
            return compose("config", overrides=overrides + ["bench=smoke"])
        except ConfigCompositionException:  # config.yaml has no bench default: append the group
            return compose("config", overrides=overrides + ["+bench=smoke"])


def test_hydra_composes_and_instantiates_the_bench_group():
    cfg = _compose_app(["task=benchmark"])
    built = instantiate(cfg.bench)
    assert isinstance(built, BenchConfig)
    assert built == BenchConfig.from_any(cfg.bench) == load_preset("smoke")
    assert OmegaConf.select(cfg, "bench.grid.seq_len") == 5
