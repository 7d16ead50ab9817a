"""Every config group composes, every `_target_` is real, and configs match constructors."""
import inspect
import os
from pathlib import Path

import pytest
from cli_helpers import CONF, compose_config
from hydra.errors import ConfigCompositionException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

from lightning_rnn.modules import RNNModule

HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def group_options():
    """``group=option`` for every option of every config group (nested groups with /)."""
    options = []
    for directory, _, files in os.walk(CONF, followlinks=True):  # conf/experiment links to recipes/
        group = Path(directory).relative_to(CONF).as_posix()
        options += [f"{group}={Path(f).stem}" for f in sorted(files) if f.endswith(".yaml") and group != "."]
    return sorted(options)


def target_nodes(node, where="cfg"):
    """(location, node) for every config node that has a `_target_`."""
    if isinstance(node, DictConfig):
        if "_target_" in node:
            yield where, node
        for key in node:
            yield from target_nodes(node._get_node(key), f"{where}.{key}")
    elif isinstance(node, ListConfig):
        for i, item in enumerate(node):
            yield from target_nodes(item, f"{where}[{i}]")


def accepted_parameters(target) -> set[str] | None:
    """Names ``target`` accepts; for modules taking **kwargs, also RNNModule's."""
    init = target.__init__ if inspect.isclass(target) else target
    params = inspect.signature(init).parameters
    names = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        if inspect.isclass(target) and issubclass(target, RNNModule):
            return names | set(inspect.signature(RNNModule.__init__).parameters)
        return None  # open signature: cannot check
    return names


def test_every_group_has_options():
    groups = {option.split("=")[0] for option in group_options()}
    assert {"data", "model", "model/rnn", "model/optimizer", "trainer", "callbacks", "logger", "experiment",
            "debug", "hparams_search", "task"} <= groups


#: Groups that only exist under a task: the overrides that bring them in.
REQUIRES = {"bench": ["task=benchmark"]}


@pytest.mark.parametrize("option", group_options())
def test_option_composes_and_its_targets_match_constructors(option, tmp_path):
    cfg = compose_config(tmp_path, [*REQUIRES.get(option.split("=")[0], []), option])
    for where, node in target_nodes(cfg):
        target = get_object(node._target_)
        accepted = accepted_parameters(target)
        if accepted is not None:
            unknown = set(node.keys()) - HYDRA_KEYS - accepted
            assert not unknown, f"{where}: {node._target_} has no parameters {sorted(unknown)}"


def test_unknown_keys_are_errors(tmp_path):
    with pytest.raises(ConfigCompositionException, match="hidden_sizes"):
        compose_config(tmp_path, ["model.rnn.hidden_sizes=3"])
    with pytest.raises(ConfigCompositionException):
        compose_config(tmp_path, ["data.batchsize=3"])


def test_default_config_is_the_char_python_recipe(tmp_path):
    cfg = compose_config(tmp_path)
    assert cfg.model._target_ == "lightning_rnn.modules.CharLanguageModel"
    assert cfg.model.rnn._target_ == "lightning_rnn.layers.FusedLSTM"
    assert cfg.data.corpus == "python_stdlib" and cfg.data.path is None
    assert OmegaConf.is_missing(cfg.model, "vocab")  # filled from the data at run time
    assert cfg.logger.wandb.mode == os.environ.get("WANDB_MODE", "offline")  # offline unless WANDB_MODE says
    assert cfg.trainer.default_root_dir == str(tmp_path)


def test_the_wandb_logger_takes_a_run_id_to_log_into(tmp_path):
    """logger.wandb.id=ID continues run ID (a resumed training run), without Hydra's `+`."""
    cfg = compose_config(tmp_path, ["logger.wandb.id=abc123", "logger.wandb.mode=disabled"])
    assert instantiate(cfg.logger.wandb)._id == "abc123"


def test_data_configs_instantiate(tmp_path, small_text):
    for option in ("data=char_python", "data=adding_problem", "data=copy_memory", "data=classification",
                   "data=forecasting", "data=char_file"):
        overrides = [option] + ([f"data.path={small_text}"] if option == "data=char_file" else [])
        datamodule = instantiate(compose_config(tmp_path, overrides).data)
        assert hasattr(datamodule, "model_kwargs")


def test_recipe_overrides_reach_the_constructor(tmp_path):
    cfg = compose_config(tmp_path, ["experiment=char_shakespeare_large"])
    assert (cfg.model.rnn.hidden_size, cfg.model.rnn.num_layers) == (512, 3)
    assert cfg.model.rnn.dropout == 0.25  # the large recipe's own value over char_shakespeare's
    assert cfg.model.scheduler._target_ == "lightning_rnn.modules.schedules.BudgetCosine"  # inherited
    assert cfg.trainer.max_time == "00:00:10:00"
    assert cfg.data.corpus == "tiny_shakespeare"


def test_char_file_needs_a_path(tmp_path):
    """data=char_file on its own must not fall back to the embedded corpus."""
    from omegaconf.errors import MissingMandatoryValue

    cfg = compose_config(tmp_path, ["data=char_file"])
    with pytest.raises(MissingMandatoryValue, match="data.path"):
        cfg.data.path
