"""Every recipe trains (fast_dev_run); tasks, Optuna sweeps and wandb work in-process."""
import json
import logging
import math
from pathlib import Path

import pytest
import torch
import yaml
from cli_helpers import CONF, QUICK, compose_config
from hydra.errors import InstantiationException
from lightning.pytorch import Trainer
from omegaconf import OmegaConf

from lightning_rnn.cli import is_setting_error, missing_sweeper, route_lightning_logs_through_hydra, run, setting_error
from lightning_rnn.data.corpora import CorpusUnavailableError
from lightning_rnn.kernels.dispatch import BackendUnavailable
from lightning_rnn.kernels.checkpointing import check_chunk_size
from lightning_rnn.tasks import sample, test, train
from lightning_rnn.tasks.builders import load_model

RECIPES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))

#: Per-recipe overrides that shrink the data (the models stay as the recipes define them).
SHRINK = {
    "char": ["data.batch_size=4", "data.seq_len=16"],
    "adding_problem": ["data.num_train=8", "data.num_val=8", "data.num_test=8", "data.batch_size=4"],
    "copy_memory": ["data.num_train=8", "data.num_val=8", "data.num_test=8", "data.batch_size=4"],
    "classification": ["data.num_samples=40", "data.batch_size=8"],
    "forecasting": ["data.num_steps=1000", "data.batch_size=8"],
}


def shrink(recipe, small_text):
    if recipe.startswith("char_shakespeare"):
        return SHRINK["char"] + [f"data.path={small_text}"]
    return SHRINK.get(recipe, SHRINK["char"])


def test_recipes_are_listed():
    assert {"char_python", "char_shakespeare", "char_shakespeare_large", "adding_problem", "classification",
            "forecasting", "ddp_cpu", "optuna_sweep"} <= set(RECIPES)


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r != "ddp_cpu"])  # ddp_cpu: test_cli_subprocess
def test_recipe_fast_dev_run(recipe, tmp_path, small_text):
    cfg = compose_config(tmp_path, [f"experiment={recipe}", "trainer.fast_dev_run=true", *QUICK,
                                    *shrink(recipe, small_text)])
    metric = train.run(cfg)
    assert metric is not None and math.isfinite(metric)


def test_train_then_test_then_sample_in_process(tmp_path, capsys):
    common = ["model.rnn.hidden_size=16", "model.rnn.num_layers=1", "model.embedding_dim=8", "data.batch_size=4",
              "data.seq_len=16", "model.val_sample_length=0", "model.rnn.backend=reference", "logger=none"]
    checkpoint_only = ["~callbacks.rich_progress_bar", "~callbacks.rich_model_summary",
                       "~callbacks.learning_rate_monitor"]
    cfg = compose_config(tmp_path, [*common, *checkpoint_only, "trainer.max_steps=2", "trainer.val_check_interval=2",
                                    "trainer.limit_val_batches=1"])
    train.run(cfg)
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()

    cfg = compose_config(tmp_path, [*common, "callbacks=none", "task=test", f"ckpt_path={ckpt}",
                                    "trainer.limit_test_batches=2"])
    metrics = test.run(cfg)
    assert metrics["test/bpc"] == pytest.approx(metrics["test/loss"] / math.log(2), rel=1e-4)

    cfg = compose_config(tmp_path, [*common, "task=sample", f"ckpt_path={ckpt}", "sample.length=25",
                                    "sample.start_text='def '"])
    capsys.readouterr()  # drop the training output
    text = sample.run(cfg)
    assert text.startswith("def ") and len(text) == 29
    assert capsys.readouterr().out == text + "\n"

    # resume: the run continues from the checkpoint's step (and tests its best checkpoint after)
    resumed = tmp_path / "resumed"
    cfg = compose_config(resumed, [*common, *checkpoint_only, "trainer.max_steps=4", "trainer.val_check_interval=2",
                                   "trainer.limit_val_batches=1", f"ckpt_path={ckpt}", "test_after_training=true",
                                   "trainer.limit_test_batches=1"])
    train.run(cfg)
    steps = sorted(p.name for p in (resumed / "checkpoints").glob("step*.ckpt"))
    assert steps == ["step000004.ckpt"]  # steps 3-4 only: 1-2 came from the checkpoint


def test_plateau_scheduler_trains_from_the_command_line(tmp_path):
    """model/scheduler=plateau: stepped with val/loss after each validation (Lightning would drop its monitor)."""
    cfg = compose_config(tmp_path, ["model.rnn.hidden_size=8", "model.rnn.num_layers=1", "data.batch_size=4",
                                    "data.seq_len=8", "model.val_sample_length=0", "model.rnn.backend=reference",
                                    "logger=csv", "trainer.max_steps=4", "trainer.val_check_interval=2",
                                    "trainer.limit_val_batches=1", "model/scheduler=plateau",
                                    "model.scheduler.patience=0", "model.scheduler.threshold=10",
                                    "model.scheduler.threshold_mode=abs"])
    train.run(cfg)
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    lr = cfg.model.optimizer.lr
    assert checkpoint["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(lr * 0.5)  # 2 validations


@pytest.mark.parametrize("overrides, message", [
    (["data=classification", "data.num_samples=40"],
     "model: CharLanguageModel needs vocab from the data, which SequenceClassificationDataModule does not give "
     r"\(it gives input_size, num_classes\)"),
    (["data=copy_memory", "model=classifier"], "model: SequenceClassifier needs input_size, num_classes from the data"),
])
def test_a_model_and_data_that_do_not_go_together_are_named(tmp_path, overrides, message):
    cfg = compose_config(tmp_path, [*overrides, "logger=none", "trainer.max_steps=1"])
    with pytest.raises(ValueError, match=message):
        train.run(cfg)


def test_an_optuna_sweep_without_its_plugin_names_the_extra(monkeypatch):
    import builtins

    assert missing_sweeper(["hparams_search=optuna"]) is None  # installed with the dev extras
    real_import = builtins.__import__

    def no_optuna(name, *args, **kwargs):
        if name.startswith("hydra_plugins.hydra_optuna_sweeper"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_optuna)
    for args in (["hparams_search=optuna"], ["-m", "experiment=optuna_sweep"]):
        assert 'pip install "lightning_rnn[optuna]"' in missing_sweeper(args)
    assert missing_sweeper(["trainer.max_steps=3"]) is None


def test_train_with_logger_none_keeps_the_default_callbacks(tmp_path):
    """The default callbacks include a LearningRateMonitor, which Lightning refuses without a logger."""
    cfg = compose_config(tmp_path, ["model.rnn.hidden_size=8", "model.rnn.num_layers=1", "data.batch_size=4",
                                    "data.seq_len=8", "model.val_sample_length=0", "model.rnn.backend=reference",
                                    "logger=none", "trainer.max_steps=1", "trainer.limit_val_batches=0"])
    assert "learning_rate_monitor" in cfg.callbacks
    train.run(cfg)
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


def test_sample_names_the_model_class_of_any_checkpoint(tmp_path):
    """A classification checkpoint given to task=sample: the error says what it is, whatever cfg.model says."""
    cfg = compose_config(tmp_path, ["experiment=classification", *SHRINK["classification"], "logger=none",
                                    "model.rnn.backend=reference", "trainer.max_epochs=1"])
    train.run(cfg)
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    cfg = compose_config(tmp_path, ["task=sample", f"ckpt_path={ckpt}", *QUICK])  # the default model: char LM
    with pytest.raises(TypeError, match=f"ckpt_path: {ckpt} holds a SequenceClassifier, which has no sample"):
        sample.run(cfg)


def save_untrained_checkpoint(cfg, path):
    """A checkpoint of the model ``cfg`` builds, saved as Lightning would (no training); its path."""
    from lightning_rnn.tasks.builders import build_datamodule, build_model
    model = build_model(cfg, build_datamodule(cfg))
    checkpoint = {"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
                  "pytorch-lightning_version": "2.6.0"}
    model.on_save_checkpoint(checkpoint)  # the factories as plain data
    torch.save(checkpoint, path)
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_backend_of_another_device_is_refused_before_the_run(tmp_path, monkeypatch):
    """backend=cuda with the Trainer on a CPU: one error naming the setting before anything
    runs (it failed at the first batch, after the model summary and a progress bar)."""
    started = []
    monkeypatch.setattr(Trainer, "fit", lambda *args, **kwargs: started.append(1))
    small = ["model.rnn.hidden_size=8", "model.rnn.num_layers=1", "data.batch_size=4", "data.seq_len=8",
             "logger=none", "callbacks=none"]
    with pytest.raises(ValueError, match=r"^model\.rnn\.backend: 'cuda' does not run on the Trainer's cpu device"):
        train.run(compose_config(tmp_path, [*small, "model.rnn.backend=cuda"]))
    assert not started
    train.run(compose_config(tmp_path, [*small, "model.rnn.backend=reference"]))
    assert started


def test_checkpoint_tasks_run_the_layers_on_the_configured_backend(tmp_path, capsys):
    """The kernel backend is how to run the weights, not part of them: a checkpoint trained
    with backend=cuda samples on a CPU with model.rnn.backend=reference (the override was
    ignored, and the saved 'cuda' failed: no GPU)."""
    small = ["model.rnn.hidden_size=8", "model.rnn.num_layers=1", "data.batch_size=4", "data.seq_len=8",
             "model.val_sample_length=0", "logger=none", "callbacks=none"]
    cfg = compose_config(tmp_path, [*small, "model.rnn.backend=cuda"])
    ckpt = save_untrained_checkpoint(cfg, tmp_path / "gpu.ckpt")
    cfg = compose_config(tmp_path, [*small, "task=sample", f"ckpt_path={ckpt}", "sample.length=5",
                                    "model.rnn.backend=reference"])
    assert len(sample.run(cfg)) == 1 + 5  # the default start text "\n", then 5 characters
    model = load_model(cfg)
    assert model.rnn.backend == "reference" and model.hparams.rnn.keywords["backend"] == "reference"
    assert model.hparams.rnn.keywords["hidden_size"] == 8  # the rest from the checkpoint


def test_test_task_logs_the_checkpoint_s_model_settings(tmp_path):
    """The test run's logged config describes the model it evaluated (it logged the default
    model config, hidden_size 128, whatever the checkpoint held)."""
    small = ["model.rnn.hidden_size=8", "model.rnn.num_layers=1", "data.batch_size=4", "data.seq_len=8",
             "model.val_sample_length=0", "model.rnn.backend=reference", "callbacks=none"]
    ckpt = save_untrained_checkpoint(compose_config(tmp_path, [*small, "logger=none"]), tmp_path / "model.ckpt")
    cfg = compose_config(tmp_path, ["task=test", f"ckpt_path={ckpt}", "logger=csv", "callbacks=none",
                                    "trainer.limit_test_batches=1"])
    assert cfg.model.rnn.hidden_size == 128
    test.run(cfg)
    (hparams,) = tmp_path.glob("csv/version_*/hparams.yaml")
    logged = yaml.safe_load(hparams.read_text())["model"]
    assert logged["_target_"] == "lightning_rnn.modules.char_lm.CharLanguageModel"
    assert (logged["rnn"]["hidden_size"], logged["rnn"]["num_layers"]) == (8, 1)
    assert logged["rnn"]["backend"] == "auto"  # the run's backend (backend_override)


def test_test_task_rejects_a_checkpoint_of_other_data(tmp_path, small_text):
    cfg = compose_config(tmp_path, ["model.rnn.hidden_size=8", "model.rnn.num_layers=1", "data.batch_size=4",
                                    "data.seq_len=8", "model.val_sample_length=0", "model.rnn.backend=reference",
                                    "logger=none", "callbacks=none", "trainer.max_steps=1", "trainer.limit_val_batches=0"])
    train.run(cfg)
    ckpt = save_untrained_checkpoint(cfg, tmp_path / "model.ckpt")  # fast_dev_run saves none
    other = compose_config(tmp_path, ["task=test", f"ckpt_path={ckpt}", "data=char_file", f"data.path={small_text}",
                                      *QUICK])
    with pytest.raises(ValueError, match=f"ckpt_path: {ckpt} was trained on other data \\(another vocab: "):
        test.run(other)


@pytest.mark.parametrize("torch_default_unpickles", [False, True])
def test_a_checkpoint_of_pickled_objects_is_refused_naming_ckpt_path(tmp_path, monkeypatch, torch_default_unpickles):
    """torch's weights_only loader refuses pickled callables (checkpoints of earlier
    versions held the factories so): one setting error that says how to load it if trusted.
    Also where torch.load's default is weights_only=False (torch < 2.6; later torch reads
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 so, when the caller does not pass weights_only)."""
    import functools

    if torch_default_unpickles:
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")

    from lightning_rnn.layers import FusedLSTM
    from lightning_rnn.tasks.checkpoint_checks import check_checkpoint_file

    ckpt = tmp_path / "old.ckpt"
    torch.save({"hyper_parameters": {"rnn": functools.partial(FusedLSTM, hidden_size=8)}}, ckpt)
    with pytest.raises(ValueError, match="ckpt_path: .* holds pickled Python objects") as caught:
        check_checkpoint_file(str(ckpt), required=True)
    assert is_setting_error(caught.value)


@pytest.mark.parametrize("content, message", [
    (b"not a checkpoint at all", "is not a readable torch checkpoint"),
    (None, r"is not a Lightning checkpoint \(no 'state_dict'\)"),
])
def test_unreadable_checkpoints_are_named(tmp_path, content, message):
    from lightning_rnn.tasks.checkpoint_checks import check_checkpoint_file

    ckpt = tmp_path / "bad.ckpt"
    if content is None:
        torch.save({"weight": torch.zeros(2)}, ckpt)  # a plain state dict
    else:
        ckpt.write_bytes(content)
    with pytest.raises(ValueError, match=f"ckpt_path: .*{message}") as caught:
        check_checkpoint_file(str(ckpt), required=True)
    assert is_setting_error(caught.value)


def test_resuming_with_other_model_settings_is_named_before_lightning_loads(tmp_path):
    from lightning_rnn.tasks.checkpoint_checks import check_checkpoint_fits

    small, large = torch.nn.Linear(2, 3), torch.nn.Linear(2, 4)
    with pytest.raises(ValueError, match=r"ckpt_path: small.ckpt does not fit this model: weight \(checkpoint "
                                         r"\(3, 2\), now \(4, 2\)\)"):
        check_checkpoint_fits({"state_dict": small.state_dict()}, "small.ckpt", large)
    check_checkpoint_fits({"state_dict": large.state_dict()}, "large.ckpt", large)


@pytest.mark.parametrize("batch_size, processes", [(20, 1), (6, 2)])
def test_a_test_split_too_small_for_a_batch_ends_the_run_before_training(tmp_path, small_text, monkeypatch,
                                                                          batch_size, processes):
    """test_after_training with a test split shorter than one batch: named at the start (it
    was found after training, with a message naming neither the split nor a setting). Under
    DDP each process needs its own batch: 1074 characters hold 6 streams of 100, not 2 x 6."""
    monkeypatch.setattr(Trainer, "fit", lambda *args, **kwargs: pytest.fail("training started"))
    ddp = ["trainer=ddp", "trainer.accelerator=cpu"] if processes > 1 else []
    cfg = compose_config(tmp_path, ["data=char_file", f"data.path={small_text}", f"data.batch_size={batch_size}",
                                    "data.seq_len=100", "data.test_fraction=0.05", "test_after_training=true",
                                    "model.rnn.backend=reference", "logger=none", *ddp])
    with pytest.raises(ValueError, match="seq_len: the test split has 1074 characters, too few for one batch of "
                                         f"batch_size={batch_size}{' x 2 processes' * (processes > 1)} ") as caught:
        train.run(cfg)
    assert is_setting_error(caught.value)


def test_wandb_offline_logs_config_metrics_and_sample_table(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    trainers = []
    build_trainer = train.build_trainer
    monkeypatch.setattr(train, "build_trainer",
                        lambda cfg, **kwargs: trainers.append(build_trainer(cfg, **kwargs)) or trainers[-1])
    cfg = compose_config(tmp_path, ["model.rnn.hidden_size=8", "model.rnn.num_layers=1", "data.batch_size=4",
                                    "data.seq_len=8", "model.val_sample_length=20", "model.rnn.backend=reference",
                                    "callbacks=none", "trainer.max_steps=2", "trainer.val_check_interval=2",
                                    "trainer.limit_val_batches=1", "trainer.log_every_n_steps=1"])
    train.run(cfg)
    run = trainers[0].logger.experiment
    assert run.settings._offline and Path(run.dir).is_relative_to(tmp_path / "wandb")
    assert run.config["model"]["_target_"] == "lightning_rnn.modules.CharLanguageModel"  # the resolved config
    assert run.config["model"]["vocab"] == trainers[0].lightning_module.vocab.chars  # filled in from the data
    assert {"train/loss", "val/loss", "val/bpc"} <= set(run.summary.keys())
    run.finish()
    (table,) = Path(run.dir).glob("media/table/val/samples_*.table.json")
    content = json.loads(table.read_text())
    assert content["columns"] == ["step", "text"] and content["data"][0][0] == 2
    assert len(content["data"][0][1]) == 20  # val_sample_length characters, the first drawn uniformly


def test_each_job_of_a_multirun_logs_to_a_wandb_run_of_its_own(hydra_sweep_runner, tmp_path, monkeypatch):
    """WandbLogger reuses a wandb run in progress: unless each job ends its run, the second
    job of `-m seed=1,2` logged into the first job's run and wrote no wandb folder."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    overrides = ["seed=1,2", "data.batch_size=4", "data.seq_len=8", "trainer.max_steps=1",
                 "trainer.limit_val_batches=0", "model.rnn.hidden_size=8", "model.rnn.num_layers=1",
                 "model.val_sample_length=0", "model.rnn.backend=reference", "callbacks=none"]
    with hydra_sweep_runner(calling_file=None, calling_module="lightning_rnn.cli", task_function=run,
                            config_path=str(CONF), config_name="config", overrides=overrides,
                            temp_dir=tmp_path / "sweep"):  # removed on exit
        runs = [sorted((tmp_path / "sweep" / job / "wandb").glob("offline-run-*")) for job in ("0", "1")]
    assert [len(r) for r in runs] == [1, 1]
    assert runs[0][0].name.rsplit("-", 1)[1] != runs[1][0].name.rsplit("-", 1)[1]  # two run ids
    assert wandb.run is None


@pytest.mark.parametrize("mode, files", [("disabled", False), ("offline", True)])
def test_the_wandb_logger_follows_wandb_mode(tmp_path, monkeypatch, mode, files):
    """WANDB_MODE picks the mode of logger=wandb (Lightning's offline=true overrode it:
    WANDB_MODE=disabled still wrote an offline run)."""
    monkeypatch.setenv("WANDB_MODE", mode)
    cfg = compose_config(tmp_path, ["trainer.max_steps=1", "trainer.limit_val_batches=0", "data.batch_size=4",
                                    "data.seq_len=8", "model.rnn.hidden_size=8", "model.rnn.num_layers=1",
                                    "model.val_sample_length=0", "model.rnn.backend=reference", "callbacks=none",
                                    "task=train"])
    run(cfg)
    assert any((tmp_path / "wandb").glob("offline-run-*")) is files


def test_optuna_sweep_returns_the_optimized_metric(hydra_sweep_runner, tmp_path):
    overrides = ["experiment=optuna_sweep", "hydra.sweeper.n_trials=2", f"output_dir={tmp_path}", "data.batch_size=4",
                 "data.seq_len=16", "trainer.max_steps=2", "trainer.val_check_interval=2",
                 "trainer.limit_val_batches=1", "model.rnn.backend=reference", "callbacks=none", "logger=none"]
    # temp_dir given: the plugin turns a missing one into a folder named "None" in the working directory
    with hydra_sweep_runner(calling_file=None, calling_module="lightning_rnn.cli", task_function=run, config_path=str(CONF),
                            config_name="config", overrides=overrides, temp_dir=tmp_path / "sweep") as sweep:
        sweep_dir = Path(sweep.temp_dir)
        results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
        trials = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir())
    assert trials == ["0", "1"]
    assert results["name"] == "optuna" and 0 < results["best_value"] < math.log(256)  # a val/loss in nats
    assert set(results["best_params"]) == {"model.optimizer.lr", "model.rnn.hidden_size"}


def test_a_sweep_whose_metric_is_never_logged_ends_with_the_reason(hydra_sweep_runner, tmp_path, monkeypatch):
    """No validation (limit_val_batches=0), so no val/loss: rather than Optuna's "No trials
    are completed yet" after every trial, the first trial ends the sweep naming the cause."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    overrides = ["experiment=optuna_sweep", "hydra.sweeper.n_trials=2", f"output_dir={tmp_path}", "data.batch_size=4",
                 "data.seq_len=16", "trainer.max_steps=2", "trainer.limit_val_batches=0",
                 "model.rnn.backend=reference", "callbacks=none", "logger=none"]
    with pytest.raises(SystemExit) as exit_info:
        with hydra_sweep_runner(calling_file=None, calling_module="lightning_rnn.cli", task_function=run,
                                config_path=str(CONF), config_name="config", overrides=overrides,
                                temp_dir=tmp_path / "sweep"):
            pass
    message = str(exit_info.value.code)
    assert message.startswith("Error: optimized_metric: 'val/loss' was never logged (logged: train/")
    assert "trainer.limit_val_batches=0" in message


def test_a_single_run_whose_metric_is_never_logged_warns_and_returns_none(tmp_path, caplog):
    cfg = compose_config(tmp_path, ["trainer.max_steps=2", "trainer.limit_val_batches=0", "data.batch_size=4",
                                    "data.seq_len=16", *QUICK])
    with caplog.at_level(logging.WARNING, logger="lightning_rnn.tasks.train"):
        assert train.run(cfg) is None
    assert any("optimized_metric: 'val/loss' was never logged" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("ckpt, message", [(None, "ckpt_path: this task needs a checkpoint file"),
                                           ("", "ckpt_path: this task needs a checkpoint file"),
                                           ("/no/such.ckpt", "ckpt_path: /no/such.ckpt does not exist;")])
def test_checkpoint_tasks_need_a_checkpoint_file(tmp_path, ckpt, message):
    cfg = compose_config(tmp_path, ["task=sample", f"ckpt_path={'null' if ckpt is None else ckpt}", *QUICK])
    with pytest.raises(ValueError, match=message):
        sample.run(cfg)


def test_train_checks_a_given_checkpoint_before_building_anything(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "build_datamodule", lambda cfg: pytest.fail("data built before the check"))
    cfg = compose_config(tmp_path, ["ckpt_path=/no/such.ckpt", *QUICK])
    with pytest.raises(ValueError, match="ckpt_path: /no/such.ckpt does not exist"):
        train.run(cfg)


def test_a_setting_error_ends_the_run_with_its_message_not_a_traceback(tmp_path, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    cfg = compose_config(tmp_path, ["ckpt_path=/no/such.ckpt", *QUICK])
    with pytest.raises(SystemExit) as exit_info:
        run(cfg)
    message = str(exit_info.value.code)
    assert message.startswith("Error: ckpt_path: /no/such.ckpt does not exist") and "HYDRA_FULL_ERROR=1" in message
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # the exception itself, for its traceback
    with pytest.raises(ValueError, match="ckpt_path: /no/such.ckpt does not exist"):
        run(cfg)


def _raise_here(error):
    raise error


@pytest.mark.parametrize("make_error, expected", [
    (lambda: check_chunk_size(0), True),  # the package's own argument check
    (lambda: _raise_here(ValueError("from a test module")), False),  # outside the package: keep the traceback
    (lambda: _raise_here(RuntimeError("a kernel failure")), False),
    (lambda: OmegaConf.create({"path": "???"}).path, True),  # a mandatory value left unset
    (lambda: _raise_here(CorpusUnavailableError("offline: pass data.path=...")), True),
    (lambda: _raise_here(BackendUnavailable("the 'cuda' backend needs a GPU and nvcc")), True),
])
def test_which_errors_are_setting_errors(make_error, expected):
    with pytest.raises(Exception) as info:
        make_error()
    assert is_setting_error(info.value) is expected


def test_a_constructor_s_setting_error_is_found_behind_hydra_s_instantiate(tmp_path, monkeypatch):
    """instantiate() wraps what a constructor raises; the run reports the constructor's message."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    cfg = compose_config(tmp_path, ["model.rnn.hidden_size=-3", *QUICK])
    with pytest.raises(SystemExit) as exit_info:
        run(cfg)
    assert str(exit_info.value.code).startswith("Error: hidden_size: expected an int >= 1, got -3\n")
    wrapped = InstantiationException("Error in call to target 'x':\nRuntimeError('a bug')")
    wrapped.__cause__ = RuntimeError("a bug")
    assert setting_error(wrapped) is None  # a wrapped non-setting error keeps its traceback


def test_lightning_messages_reach_hydra_s_handlers_once():
    """Inside a Hydra run (handlers on the root logger) Lightning's own console handler is
    dropped, so its messages are printed once, by Hydra's handlers, and reach cli.log."""
    import lightning  # noqa: F401  (gives the "lightning" logger its console handler)

    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    root, package = logging.getLogger(), logging.getLogger("lightning")
    saved = root.handlers[:], package.handlers[:], package.propagate
    collect = Collect()
    try:
        root.addHandler(collect)
        package.addHandler(logging.StreamHandler())  # as `import lightning` does, whatever ran before
        route_lightning_logs_through_hydra()
        assert not [h for h in package.handlers if type(h) is logging.StreamHandler] and package.propagate
        logging.getLogger("lightning.pytorch.utilities.rank_zero").info("`Trainer.fit` stopped")
        assert records.count("`Trainer.fit` stopped") == 1
    finally:
        root.handlers[:], package.handlers[:], package.propagate = saved


def test_a_projects_own_configs_and_lightning_datamodule_train(tmp_path):
    """A project adds its own options to the library's groups with Hydra's search path
    (``hydra.searchpath=[file://DIR]``, as docs/training.md says), and its data module may be any
    LightningDataModule: one without ``model_kwargs()`` (the CLI called it, an
    AttributeError) gives the model nothing, and the config gives its sizes."""
    user_conf = Path(__file__).resolve().parent / "user_conf"
    cfg = compose_config(tmp_path, [f"hydra.searchpath=[file://{user_conf}]", "experiment=user_classification",
                                    "trainer.max_steps=4", "trainer.val_check_interval=4", *QUICK])
    assert cfg.data._target_ == "user_data.PlainSequenceData" and cfg.model.num_classes == 2
    metric = train.run(cfg)
    assert metric is not None and math.isfinite(metric)


def test_a_plain_datamodule_with_sizes_left_unset_names_how_to_give_them(tmp_path):
    user_conf = Path(__file__).resolve().parent / "user_conf"
    cfg = compose_config(tmp_path, [f"hydra.searchpath=[file://{user_conf}]", "data=plain_sequences",
                                    "model=classifier", "trainer.max_steps=1", *QUICK])
    with pytest.raises(ValueError, match=r"SequenceClassifier needs input_size, num_classes from the data, which "
                                         r"PlainSequenceData does not give \(it gives nothing\).*set them in the "
                                         r"config \(model.NAME=...\) or give its data module a model_kwargs\(\)"):
        train.run(cfg)
