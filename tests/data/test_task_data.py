"""Synthetic tasks, classification and forecasting data."""
import json
import math

import pytest
import torch

from lightning_rnn.data import (
    AddingProblemDataModule,
    CopyMemoryDataModule,
    ForecastingDataModule,
    SequenceClassificationDataModule,
    pad_batch,
)
from lightning_rnn.data.synthetic import adding_problem, copy_memory


def test_adding_problem_target_is_the_sum_of_the_marked_values():
    data = adding_problem(64, 40, torch.Generator().manual_seed(0))
    values, markers = data["inputs"].unbind(-1)
    assert data["inputs"].shape == (64, 40, 2) and data["targets"].shape == (64, 1, 1)
    assert torch.equal(markers.sum(1), torch.full((64,), 2.0))
    assert torch.all(markers[:, :20].sum(1) == 1) and torch.all(markers[:, 20:].sum(1) == 1)
    torch.testing.assert_close(data["targets"].view(-1), (values * markers).sum(1))


def test_copy_memory_target_repeats_the_symbols_after_the_delimiter():
    data = copy_memory(8, delay=30, num_symbols=5, generator=torch.Generator().manual_seed(0))
    inputs, targets = data["inputs"], data["targets"]
    assert inputs.shape == targets.shape == (8, 40)
    assert torch.equal(targets[:, -5:], inputs[:, :5])
    assert torch.all(inputs[:, 34] == 9) and torch.all(targets[:, :35] == 0)
    assert inputs[:, :5].min() >= 1 and inputs[:, :5].max() <= 8


def test_synthetic_datamodules_are_seeded_per_split():
    a, b = (AddingProblemDataModule(seq_len=10, num_train=16, num_val=8, num_test=8, batch_size=4) for _ in range(2))
    a.setup(), b.setup()
    assert torch.equal(a.datasets["train"].tensors["inputs"], b.datasets["train"].tensors["inputs"])
    assert not torch.equal(a.datasets["val"].tensors["inputs"][:8], a.datasets["train"].tensors["inputs"][:8])
    assert a.model_kwargs() == {"input_size": 2, "output_size": 1, "horizon": 1}
    copy = CopyMemoryDataModule(delay=5, num_train=4, num_val=4, num_test=4)
    assert copy.model_kwargs()["vocab"] == "-ABCDEFGH:"
    with pytest.raises(ValueError, match="num_train"):
        AddingProblemDataModule(num_train=0)


def test_pad_batch_pads_and_reports_lengths():
    items = [{"inputs": torch.ones(n, 2), "targets": torch.tensor(n)} for n in (3, 1, 2)]
    batch = pad_batch(items)
    assert batch["inputs"].shape == (3, 3, 2)
    assert batch["lengths"].tolist() == [3, 1, 2]
    assert batch["inputs"][1, 1:].abs().sum() == 0


def test_classification_synthetic_lengths_and_loaders():
    dm = SequenceClassificationDataModule(num_samples=100, num_classes=3, min_len=5, max_len=12, batch_size=10)
    dm.setup()
    assert dm.model_kwargs() == {"input_size": 1, "num_classes": 3}
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [80, 10, 10]
    batch = next(iter(dm.train_dataloader()))
    assert batch["lengths"].min() >= 5 and batch["lengths"].max() <= 12
    assert batch["inputs"].shape[1] == batch["lengths"].max()


def test_classification_reads_jsonl_and_csv(tmp_path):
    jsonl = tmp_path / "data.jsonl"
    records = [{"sequence": [[i, -i]] * (i + 1), "label": "odd" if i % 2 else "even"} for i in range(20)]
    jsonl.write_text("\n".join(json.dumps(r) for r in records))
    dm = SequenceClassificationDataModule(path=str(jsonl), batch_size=4)
    dm.setup()
    assert dm.classes == ["even", "odd"]
    assert dm.model_kwargs() == {"input_size": 2, "num_classes": 2}

    csv_path = tmp_path / "data.csv"
    csv_path.write_text("sequence,label\n" + "\n".join(f"{' '.join(['1.5'] * (i + 1))},{i % 3}" for i in range(30)))
    dm = SequenceClassificationDataModule(path=str(csv_path), batch_size=4)
    dm.setup()
    assert dm.model_kwargs() == {"input_size": 1, "num_classes": 3}
    with pytest.raises(ValueError, match="path: expected a .csv or .jsonl"):
        bad = tmp_path / "data.txt"
        bad.write_text("x")
        SequenceClassificationDataModule(path=str(bad)).setup()


def test_classification_file_without_the_expected_columns(tmp_path):
    csv_path = tmp_path / "data.csv"
    csv_path.write_text("seq,label\n1 2,a\n")
    with pytest.raises(ValueError, match=r"path: row 1 of data.csv has no 'sequence' \(expected the keys"):
        SequenceClassificationDataModule(path=str(csv_path)).setup()
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text('{"sequence": [1, 2], "label": 0}\n{"sequence": [3]}\n')
    with pytest.raises(ValueError, match="path: row 2 of data.jsonl has no 'label'"):
        SequenceClassificationDataModule(path=str(jsonl)).setup()


@pytest.mark.parametrize("name, content, message", [
    ("data.jsonl", '{"sequence": [1, 2], "label": 0}\n{"sequence": [[1, 2], [3]], "label": 1}\n',
     "path: record 2 of data.jsonl: 'sequence' is not numbers, or lists of numbers of one length"),
    ("data.jsonl", '{"sequence": [1, 2], "label": 0}\n\nnot json\n', r"path: line 3 of data.jsonl is not JSON"),
    ("data.csv", 'sequence,label\n1 2,a\n1 x,b\n', "path: record 2 of data.csv: 'sequence' is not numbers"),
    # files without records
    ("data.jsonl", "", r"path: \S*data\.jsonl holds no records"),
    ("data.jsonl", "\n\n", r"path: \S*data\.jsonl holds no records"),
    ("data.csv", "", r"path: \S*data\.csv holds no records"),
    ("data.csv", "sequence,label\n", r"path: \S*data\.csv holds no records"),
    # a missing label is no class of its own ('' or 'None')
    ("data.csv", "sequence,label\n1 2,a\n3 4,\n5 6,b\n", "path: record 2 of data.csv has no label"),
    ("data.csv", "sequence,label\n1 2,a\n3 4\n5 6,b\n", "path: record 2 of data.csv has no label"),
    ("data.jsonl", '{"sequence": [1], "label": "a"}\n{"sequence": [2], "label": null}\n',
     "path: record 2 of data.jsonl has no label"),
    # nan in a sequence gave a nan val/loss in a run that exited 0
    ("data.csv", "sequence,label\n1 2,a\n1 nan 2,b\n", "path: record 2 of data.csv has a value that is not a finite"),
    ("data.jsonl", '{"sequence": [1, NaN], "label": 0}\n', "path: record 1 of data.jsonl has a value that is not a"),
    # valid JSON but not an object: "argument of type 'int' is not iterable"
    ("data.jsonl", '{"sequence": [1], "label": 0}\n5\n', r"path: line 2 of data.jsonl is not a JSON object"),
    ("data.csv", "sequence,label\n1 2,a\n3 4,a\n", "path: every record of data.csv has the label 'a'; a classifier"),
])
def test_classification_file_with_a_bad_record_names_it(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        SequenceClassificationDataModule(path=str(path)).setup()


def test_forecasting_file_with_only_a_header_is_named(tmp_path):
    """Was an IndexError from reading the features of an empty (0,) tensor."""
    path = tmp_path / "series.csv"
    path.write_text("temp,wind\n")
    with pytest.raises(ValueError, match=f"path: {path} has a header but no rows of values"):
        ForecastingDataModule(path=str(path)).setup()


@pytest.mark.parametrize("make, error, message", [
    (lambda: SequenceClassificationDataModule(min_len="5"), TypeError, "min_len: expected an int >= 1, got '5'"),
    (lambda: SequenceClassificationDataModule(min_len=1.5, max_len=3), TypeError, "min_len: expected an int >= 1"),
    (lambda: SequenceClassificationDataModule(max_len=None), TypeError, "max_len: expected an int >= 10, got None"),
    (lambda: SequenceClassificationDataModule(min_len=5, max_len=4), ValueError, "max_len: expected an int >= 5, got 4"),
    (lambda: SequenceClassificationDataModule(num_workers=-1), ValueError, "num_workers: expected an int >= 0, got -1"),
    (lambda: SequenceClassificationDataModule(seed="a"), TypeError, "seed: expected an int, got 'a'"),
    (lambda: ForecastingDataModule(seed=None), TypeError, "seed: expected an int, got None"),
    (lambda: AddingProblemDataModule(seed=1.5), TypeError, "seed: expected an int, got 1.5"),
    (lambda: AddingProblemDataModule(seq_len=1), ValueError, "seq_len: expected an int >= 2, got 1"),
    (lambda: CopyMemoryDataModule(seed="0"), TypeError, "seed: expected an int, got '0'"),
    (lambda: ForecastingDataModule(columns=3), TypeError, "columns: expected None, a column name or a list of names"),
])
def test_bad_data_settings_are_named_at_construction(make, error, message):
    """Were raw TypeErrors (a comparison, torch's manual_seed or randint, iterating an int) at setup."""
    with pytest.raises(error, match=message):
        make()


def test_forecasting_columns_may_come_from_a_hydra_list(tmp_path):
    """What the checks above must still accept: a Hydra ListConfig of columns, a numpy seed."""
    np = pytest.importorskip("numpy")
    from omegaconf import OmegaConf

    path = tmp_path / "series.csv"
    path.write_text("temp,wind\n" + "".join(f"{t},{t % 3}\n" for t in range(100)))
    columns = OmegaConf.create({"columns": ["wind"]}).columns
    data = ForecastingDataModule(path=str(path), columns=columns, input_len=4, horizon=2, seed=np.int64(1))
    data.setup()
    assert data.model_kwargs()["input_size"] == 1


def test_forecasting_windows_standardized_and_chronological(tmp_path):
    csv_path = tmp_path / "series.csv"
    rows = [f"{t},{math.sin(t / 5):.6f},{t % 7}" for t in range(400)]
    csv_path.write_text("t,wave,weekday\n" + "\n".join(rows))
    dm = ForecastingDataModule(path=str(csv_path), columns=["wave", "weekday"], input_len=20, horizon=5,
                               batch_size=8, val_fraction=0.2, test_fraction=0.2)
    dm.setup()
    assert dm.model_kwargs() == {"input_size": 2, "output_size": 2, "horizon": 5}
    train = dm.datasets["train"].series
    torch.testing.assert_close(train.mean(0), torch.zeros(2), atol=1e-5, rtol=0)
    item = dm.datasets["train"][3]
    assert item["inputs"].shape == (20, 2) and item["targets"].shape == (5, 2)
    assert torch.equal(item["targets"][0], train[23])
    with pytest.raises(ValueError, match="columns"):
        ForecastingDataModule(path=str(csv_path), columns=["missing"]).setup()


def test_forecasting_split_too_short_names_the_split():
    dm = ForecastingDataModule(num_steps=1000, input_len=96, horizon=24, val_fraction=0.05, test_fraction=0.1)
    with pytest.raises(ValueError, match=r"series: the val split has 50 of 1000 steps, too few .* val_fraction"):
        dm.setup()


def test_forecasting_columns_may_be_one_name(tmp_path):
    """data.columns=temp (a string) is one column, not the letters t, e, m, p."""
    from lightning_rnn.data.forecasting import read_series

    path = tmp_path / "series.csv"
    path.write_text("temp,wind\n1.5,2\n2.5,3\n")
    assert read_series(path, "temp").tolist() == [[1.5], [2.5]]
    assert read_series(path, ["wind", "temp"]).tolist() == [[2.0, 1.5], [3.0, 2.5]]


@pytest.mark.parametrize("content, message", [
    ("temp,wind\n1.5,2\n2.5,n/a\n", r"path: line 3 of series.csv, column 'wind': expected a finite number, got 'n/a'"),
    ("temp,wind\n1.5,2\n2.5\n", r"path: line 3 of series.csv, column 'wind': expected a finite number, got None"),
    # not read as nan / inf (a run with a nan loss)
    ("temp,wind\n1.5,2\nnan,3\n", r"path: line 3 of series.csv, column 'temp': expected a finite number, got 'nan'"),
    ("temp,wind\n1.5,-inf\n", r"path: line 2 of series.csv, column 'wind': expected a finite number, got '-inf'"),
    # not the last of two columns of one name twice
    ("temp,temp\n1.5,2\n", r"path: the header of series.csv names 'temp' more than once"),
    ("", r"path: \S*series.csv is empty \(expected a header"),  # not blamed on `columns`
    (b"temp\n1.5\n2\xe9\n", r"path: \S*series.csv is not UTF-8 text"),  # not a UnicodeDecodeError
])
def test_forecasting_bad_values_are_named_by_line_and_column(tmp_path, content, message):
    from lightning_rnn.data.forecasting import read_series

    path = tmp_path / "series.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=message):
        read_series(path, None)


def test_forecasting_reads_a_spreadsheet_s_byte_order_mark_and_centers_a_constant_feature(tmp_path):
    """A UTF-8 BOM is not part of the first column's name; a feature constant over the
    training part is centered, not divided by a tiny std."""
    path = tmp_path / "series.csv"
    rows = [f"{0.0 if i < 220 else 1.0},{math.cos(i / 7):.6f}" for i in range(300)]
    path.write_text("a,b\n" + "\n".join(rows) + "\n", encoding="utf-8-sig")
    data = ForecastingDataModule(path=str(path), columns=["a", "b"], input_len=10, horizon=5)
    data.setup()
    assert data.std[0].item() == 1.0 and data.mean[0].item() == 0.0
    later = torch.cat([w["targets"][:, 0] for w in (data.datasets["test"][i] for i in range(3))])
    assert later.max().item() == 1.0  # the constant's later value, centered, not scaled by 1e8


def test_classification_split_left_empty_is_named():
    data = SequenceClassificationDataModule(num_samples=8, val_fraction=0.1)
    data.setup()
    assert len(data.train_dataloader()) > 0
    with pytest.raises(ValueError, match="val_fraction: 0.1 of 8 sequences leaves the val split empty"):
        data.val_dataloader()


def test_forecasting_predictions_map_back_to_the_data_s_units(tmp_path):
    path = tmp_path / "series.csv"
    path.write_text("temp\n" + "\n".join(str(10 + 0.5 * i) for i in range(400)) + "\n")
    data = ForecastingDataModule(path=str(path), input_len=8, horizon=2, val_fraction=0.2, test_fraction=0.2)
    data.setup()
    window = data.datasets["test"][0]
    raw = data.to_data_units(window["targets"])
    # train: steps 0-239, val 240-319, test 320-399; the first test window's targets are steps 328, 329
    assert raw[:, 0].tolist() == pytest.approx([10 + 0.5 * 328, 10 + 0.5 * 329], rel=1e-5)
    assert data.mean.item() == pytest.approx(10 + 0.5 * 119.5)  # the training part's mean, steps 0-239


def test_synthetic_seeds_share_no_split():
    a, b = AddingProblemDataModule(num_train=8, num_val=8, num_test=8, seed=0), \
        AddingProblemDataModule(num_train=8, num_val=8, num_test=8, seed=1)
    a.setup(), b.setup()
    splits = [data.datasets[s].tensors["inputs"] for data in (a, b) for s in ("train", "val", "test")]
    assert all(not torch.equal(x, y) for i, x in enumerate(splits) for y in splits[i + 1:])


def test_numeric_class_labels_sort_by_value(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("sequence,label\n1 2,2\n3 4,10\n5 6,1\n7 8,2\n")
    data = SequenceClassificationDataModule(path=str(path), val_fraction=0.25, test_fraction=0.25)
    data.setup()
    assert data.classes == ["1", "2", "10"]


def test_class_labels_of_one_value_join_and_nan_sorts_as_text(tmp_path):
    """1, 1.0 and "1" name one class; a label "nan" sorts as text, so the class order (the
    label ids) does not depend on the process's hash seed."""
    path = tmp_path / "data.jsonl"
    labels = [1, 1.0, "1", "1.0", 2, "nan", "10", "cat"]
    path.write_text("".join(json.dumps({"sequence": [float(i)], "label": v}) + "\n" for i, v in enumerate(labels)))
    data = SequenceClassificationDataModule(path=str(path), val_fraction=0.125, test_fraction=0.125)
    data.setup()
    assert data.classes == ["1", "2", "10", "cat", "nan"]


def test_classification_reads_latin1_as_an_error_and_a_byte_order_mark_as_nothing(tmp_path):
    path = tmp_path / "data.csv"
    path.write_bytes(b"sequence,label\n1 2,caf\xe9\n")
    with pytest.raises(ValueError, match=r"path: \S*data.csv is not UTF-8 text"):
        SequenceClassificationDataModule(path=str(path)).setup()
    path.write_text("sequence,label\n" + "".join(f"{i} {i},{i % 2}\n" for i in range(10)), encoding="utf-8-sig")
    data = SequenceClassificationDataModule(path=str(path))
    data.setup()  # the BOM is not part of the first column's name
    assert data.classes == ["0", "1"]


def test_a_resumable_loader_shuffles_by_seed_and_epoch_and_skips_the_batches_done():
    from lightning_rnn.data import ResumableLoader

    epoch = [0]

    def batches(**kwargs):
        loader = ResumableLoader(range(20), batch_size=4, shuffle=True, seed=3, epoch=lambda: epoch[0], **kwargs)
        return loader, [b.tolist() for b in loader]

    loader, first = batches()
    torch.rand(5)  # the global random state does not matter
    assert batches()[1] == first == [b.tolist() for b in loader]  # the same epoch again: the same order
    assert sorted(sum(first, [])) == list(range(20))
    epoch[0] = 1
    assert [b.tolist() for b in loader] != first  # another epoch, another order
    resumed, _ = batches(batches_done=lambda: 2)
    resumed.load_state_dict(resumed.state_dict())
    assert [b.tolist() for b in resumed] == batches()[1][2:]  # the rest of that epoch, once
    assert [b.tolist() for b in resumed] == batches()[1]
