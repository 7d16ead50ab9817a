"""Function transforms over the fused layers: torch.func (via torch.nn's path) and torch.compile."""
import inspect
import io
import warnings

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels import dispatch

PAIRS = [(FusedLSTM, nn.LSTM), (FusedGRU, nn.GRU)]


def _loss(module):
    return lambda params, x: functional_call(module, params, (x,))[0].pow(2).sum()


@pytest.mark.parametrize("fused_class, torch_class", PAIRS)
def test_torch_func_grad_matches_torch_nn(fused_class, torch_class):
    torch.manual_seed(0)
    theirs = torch_class(3, 4, num_layers=2, dtype=torch.float64)
    ours = fused_class.from_torch(theirs)
    x = torch.randn(6, 2, 3, dtype=torch.float64)
    params = {k: v.detach() for k, v in ours.named_parameters()}
    got = grad(_loss(ours))(params, x)
    expected = grad(_loss(theirs))({k: v.detach() for k, v in theirs.named_parameters()}, x)
    assert got.keys() == expected.keys()
    for name in got:
        torch.testing.assert_close(got[name], expected[name])


@pytest.mark.parametrize("fused_class", [FusedLSTM, FusedGRU])
def test_per_sample_gradients_with_vmap_of_grad(fused_class):
    torch.manual_seed(0)
    layer = fused_class(3, 4, dtype=torch.float64)
    params = {k: v.detach() for k, v in layer.named_parameters()}
    xs = torch.randn(3, 5, 2, 3, dtype=torch.float64)  # 3 samples, each a (T, B, I) batch
    per_sample = vmap(grad(_loss(layer)), in_dims=(None, 0))(params, xs)
    for i in range(3):  # each against an ordinary backward on the default backend
        layer.zero_grad()
        layer(xs[i])[0].pow(2).sum().backward()
        for name, p in layer.named_parameters():
            torch.testing.assert_close(per_sample[name][i], p.grad)


@pytest.fixture
def resolved(monkeypatch):
    """The backends the layers resolve to, in call order (names; "torch" for torch.nn's)."""
    seen = []
    resolve = dispatch.resolve_backend

    def spy(*args):
        found = resolve(*args)
        seen.append("torch" if found is None else found.name)
        return found

    monkeypatch.setattr(dispatch, "resolve_backend", spy)
    return seen


def test_kernels_run_outside_transforms_and_torch_nn_inside(resolved):
    layer = FusedLSTM(3, 4, dtype=torch.float64)
    params = {k: v.detach() for k, v in layer.named_parameters()}
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    layer(x)
    grad(_loss(layer))(params, x)
    assert resolved[0] != "torch" and resolved[1] == "torch"


@pytest.mark.parametrize("fused_class", [FusedLSTM, FusedGRU])
def test_torch_compile_runs_the_kernels(fused_class, resolved):
    torch.manual_seed(0)
    layer = fused_class(3, 4, num_layers=2)
    x = torch.randn(5, 2, 3, requires_grad=True)
    expected = layer(x)[0]
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    compiled = torch.compile(layer, backend="aot_eager")
    out = compiled(x)[0]
    (x_grad,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x_grad, expected_grad)
    assert len(resolved) == 2 and "torch" not in resolved


class _WithHead(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn, self.head = rnn, nn.Linear(rnn.output_size * (2 if rnn.bidirectional else 1), 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


@pytest.mark.parametrize("fused_class", [FusedLSTM, FusedGRU])
def test_torch_compile_leaves_the_layer_eager_and_quiet(fused_class):
    """Compiling a model around a fused layer: the layer is not traced (no warnings about
    code Dynamo cannot trace, at most one graph break, around it), the rest is compiled,
    and the numbers are eager's."""
    torch.manual_seed(0)
    model = _WithHead(fused_class(3, 4, num_layers=2, proj_size=2 if fused_class is FusedLSTM else 0))
    x = torch.randn(5, 2, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        explained = torch._dynamo.explain(model)(x)
        out = torch.compile(model, backend="aot_eager")(x)
    assert [str(w.message) for w in caught if "Dynamo" in str(w.message)] == []
    assert explained.graph_break_count <= 1 and explained.graph_count >= 1
    torch.testing.assert_close(out, model(x))


EXPORT_CASES = [
    (FusedLSTM, {}),
    (FusedLSTM, {"bidirectional": True, "proj_size": 2}),
    (FusedGRU, {"batch_first": True}),
]


@pytest.mark.parametrize("fused_class, kwargs", EXPORT_CASES)
def test_torch_export_with_a_dynamic_batch(fused_class, kwargs):
    """torch.export captures torch.nn's op (aten.lstm / aten.gru), and the program runs a
    batch of another size with the numbers of the layer's own kernels. Non-strict export,
    torch 2.13's default, said for torch 2.4, whose default is strict: strict export traces
    with Dynamo, which runs the layer outside its graph, and export wants one whole graph."""
    torch.manual_seed(0)
    model = _WithHead(fused_class(3, 4, num_layers=2, **kwargs)).eval()
    batch_dim = 0 if kwargs.get("batch_first") else 1
    shape = [5, 5, 3]
    shape[batch_dim] = 2
    program = torch.export.export(
        model, (torch.randn(*shape),), dynamic_shapes=({batch_dim: torch.export.Dim("batch")},), strict=False
    )
    ops = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert f"aten.{fused_class.cell.name}.input" in ops
    shape[batch_dim] = 7
    x = torch.randn(*shape)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x))


@pytest.mark.parametrize("fused_class, kwargs", EXPORT_CASES)
def test_torch_jit_trace_saves_and_loads(fused_class, kwargs):
    """A traced model holds torch.nn's op, so it saves and loads as TorchScript (a traced
    kernel call would be a Python op, which cannot be saved)."""
    torch.manual_seed(0)
    model = _WithHead(fused_class(3, 4, num_layers=2, **kwargs)).eval()
    x = torch.randn(5, 2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # Python ints of the shapes
        traced = torch.jit.trace(model, (x,))
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    other = torch.randn(5, 2, 3)  # not the traced input: a recorded constant would not follow it
    with torch.no_grad():
        torch.testing.assert_close(loaded(other), model(other))


@pytest.mark.skipif(
    "dynamic_shapes" not in inspect.signature(torch.onnx.export).parameters,
    reason=f"torch {torch.__version__}: torch.onnx.export has no dynamic_shapes (torch 2.4's dynamo=True "
           "exporter traces with Dynamo, strict, which runs the layer outside its graph)",
)
@pytest.mark.parametrize("fused_class", [FusedLSTM, FusedGRU])
def test_onnx_export_runs_in_onnxruntime(fused_class, tmp_path):
    """Through torch.export to ONNX (torch's exporter), run by onnxruntime on another batch size."""
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript (the dev extra)")
    ort = pytest.importorskip("onnxruntime", reason="the dev extra installs onnxruntime")
    torch.manual_seed(0)
    model = _WithHead(fused_class(3, 4, num_layers=2, bidirectional=True)).eval()
    program = torch.onnx.export(
        model, (torch.randn(5, 2, 3),), dynamo=True, dynamic_shapes=({1: torch.export.Dim("batch")},), verbose=False
    )
    path = tmp_path / "model.onnx"
    program.save(str(path))
    session = ort.InferenceSession(str(path))
    x = torch.randn(5, 6, 3)
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), model(x), rtol=1e-5, atol=1e-5)
