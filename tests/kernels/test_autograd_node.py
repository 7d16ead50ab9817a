"""The compiled backends' C++ autograd node (csrc/rnn_autograd.h): which calls record it,
and what autograd expects of any node (gradcheck, saved-tensor hooks, versions, retained
graphs), against the Python Function it stands in for."""
import pytest
import torch

from kernel_cases import COMPILED, kernels_for, make_args, run_and_grad
from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels.grad_sink import GradSink

CELLS = [("lstm", None), ("lstm", 2), ("gru", None)]
CELL_IDS = ["lstm", "lstm_proj", "gru"]


def _call(kernels, cell):
    return kernels.lstm if cell == "lstm" else kernels.gru


def _function(kernels, cell):
    return kernels.function(cell)


def _is_node(grad_fn) -> bool:
    return grad_fn is not None and "CellNode" in grad_fn.name()


@pytest.mark.parametrize("backend,device", COMPILED)
@pytest.mark.parametrize("cell, P", CELLS, ids=CELL_IDS)
def test_a_plain_forward_records_the_node_with_the_function_s_results(cell, P, backend, device):
    """Outputs and every gradient of the node equal the Python Function's, bit for bit."""
    kernels = kernels_for(backend)
    args = make_args(cell, [4, 3, 3, 1], H=5, P=P, reverse=True, dtype=torch.float32, device=device)
    outs = _call(kernels, cell)(*args)
    assert all(_is_node(o.grad_fn) for o in outs)
    got = run_and_grad(_call(kernels, cell), args)
    want = run_and_grad(_function(kernels, cell).apply, args)
    for g, w in zip(got[0] + got[1], want[0] + want[1], strict=True):
        assert (g is None) == (w is None)
        assert g is None or torch.equal(g, w)


@pytest.mark.parametrize("backend,device", COMPILED)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_inside_a_grad_sink_the_python_function_records_the_call(cell, backend, device):
    """Gradient checkpointing sums weight gradients in a GradSink, which the Python Function's
    backward consults: calls made while one is active keep that Function."""
    kernels = kernels_for(backend)
    args = make_args(cell, [3, 3], device=device)
    with GradSink():
        out = _call(kernels, cell)(*args)[0]
    assert type(out.grad_fn).__name__ == f"{cell.upper()}FunctionBackward"


@pytest.mark.parametrize("backend,device", COMPILED)
@pytest.mark.parametrize("schedule", [[3, 3, 3], [3, 2, 2, 1]], ids=["full", "packed"])
@pytest.mark.parametrize("cell, P", CELLS, ids=CELL_IDS)
def test_gradcheck(cell, P, schedule, backend, device):
    args = make_args(cell, schedule, I=2, H=3, P=P, reverse=True, device=device)
    assert _is_node(_call(kernels_for(backend), cell)(*args)[0].grad_fn)
    assert torch.autograd.gradcheck(_call(kernels_for(backend), cell), args)


@pytest.mark.parametrize("backend,device", COMPILED)
def test_saved_tensor_hooks_see_what_the_node_saves(backend, device):
    """pack/unpack hooks (offloading, the memory benchmark's meter) get every tensor the
    node saves: x, the (N, 4H) gates, h0, c0, w_ih, w_hh, b_ih and b_hh."""
    kernels = kernels_for(backend)
    args = make_args("lstm", [3, 3, 2], H=5, device=device)
    packed, unpacked = [], []

    def pack(t):
        packed.append(t.shape)
        return t

    def unpack(t):
        unpacked.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = kernels.lstm(*args)[0]
    assert _is_node(out.grad_fn)
    assert sorted(packed) == sorted([(8, 3), (8, 20), (3, 5), (3, 5), (20, 3), (20, 5), (20,), (20,)])
    out.sum().backward()
    assert sorted(unpacked) == sorted(packed)


@pytest.mark.parametrize("backend,device", COMPILED)
def test_a_weight_changed_in_place_before_backward_is_an_error(backend, device):
    kernels = kernels_for(backend)
    x, bs, h0, c0, w_ih, w_hh, *rest = make_args("lstm", [3, 3], device=device)
    w = w_hh.detach().clone().requires_grad_()
    out = kernels.lstm(x, bs, h0, c0, w_ih, w, *rest)[0]
    with torch.no_grad():
        w.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.parametrize("backend,device", COMPILED)
def test_a_second_backward_needs_retain_graph(backend, device):
    """With retain_graph the node runs backward twice (gradients summed: twice the first);
    without it, the second backward is torch's error, not a crash."""
    kernels = kernels_for(backend)
    args = make_args("gru", [3, 2], device=device)
    out = kernels.gru(*args)[0]
    out.sum().backward(retain_graph=True)
    first = args[0].grad.clone()
    out.sum().backward()
    torch.testing.assert_close(args[0].grad, 2 * first, rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.sum().backward()


@pytest.mark.parametrize("backend,device", COMPILED)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_under_autocast_the_node_matches_the_function(cell, backend, device):
    """bf16 autocast: the node computes in the dtypes the Function does (bf16 GEMMs and
    outputs, fp32 states and weight gradients), with the same values."""
    kernels = kernels_for(backend)
    args = make_args(cell, [3, 3, 2], H=5, dtype=torch.float32, device=device)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        outs = _call(kernels, cell)(*args)
        assert _is_node(outs[0].grad_fn) and outs[0].dtype == torch.bfloat16
        got = run_and_grad(_call(kernels, cell), args)
        x = args[0].to(torch.bfloat16)  # what the backends' lstm()/gru() hand the Function
        want_outs, want_grads = run_and_grad(lambda *a: _function(kernels, cell).apply(x, *a[1:]), args)
    for g, w in zip(got[0] + got[1], want_outs + want_grads, strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)


@pytest.mark.parametrize("layer", [FusedLSTM, FusedGRU])
def test_layers_train_through_the_node(layer):
    """A FusedLSTM/FusedGRU forward on the cpp backend: one node per layer-direction."""
    module = layer(3, 4, num_layers=2, bidirectional=True, backend="cpp").double()
    out, _ = module(torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True))
    seen, todo = set(), [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        todo.extend(f for f, _ in fn.next_functions)
    assert sum(_is_node(fn) for fn in seen) == 4


@pytest.mark.parametrize("backend,device", COMPILED)
@pytest.mark.parametrize("cell, P", CELLS, ids=CELL_IDS)
def test_create_graph_gradients_equal_the_plain_ones_and_carry_a_graph(cell, P, backend, device):
    """A create_graph backward of the node calls back into Python (functions.graph_backward),
    which returns each input's gradient in the node's order: the values of the plain
    backward's, differentiable (gradgradcheck in test_second_order.py checks the second
    derivatives of these, not their order)."""
    kernels = kernels_for(backend)
    args = make_args(cell, [3, 3, 2], H=4, P=P, reverse=True, device=device)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    outs = _call(kernels, cell)(*args)
    assert _is_node(outs[0].grad_fn)
    loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype, device=o.device).view_as(o)).sum() for o in outs)
    plain = torch.autograd.grad(loss, leaves, retain_graph=True)
    graph = torch.autograd.grad(loss, leaves, create_graph=True)
    for p, g in zip(plain, graph, strict=True):
        assert g.requires_grad
        torch.testing.assert_close(g, p, rtol=1e-10, atol=1e-10)


def _outputs_and_grads(module, x, hx=None):
    out, states = module(x, hx)
    states = states if isinstance(states, tuple) else (states,)
    loss = out.square().sum() + sum(s.sum() for s in states)
    given = [] if hx is None else list(hx) if isinstance(hx, tuple) else [hx]
    leaves = [x, *given, *module.parameters()]
    return [out.detach(), *(s.detach() for s in states), *torch.autograd.grad(loss, leaves)]


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("layer", [FusedLSTM, FusedGRU])
def test_a_stack_without_dropout_runs_in_one_extension_call(layer, bidirectional, patch_backend):
    """The cpp backend runs a whole stack in one call (stack_apply, one node per
    layer-direction): the per-layer wrapper is not called, and outputs, states and every
    gradient equal the per-layer path's bit for bit."""
    torch.manual_seed(0)
    module = layer(3, 4, num_layers=3, bidirectional=bidirectional, backend="cpp")
    x = torch.randn(5, 2, 3, requires_grad=True)
    patch_backend("cpp", padded=lambda *args: None, stack=lambda *args: None)  # decline: the per-layer path
    want = _outputs_and_grads(module, x)

    def refused(*args):
        raise AssertionError("the per-layer wrapper ran")

    patch_backend("cpp", **{"lstm" if layer is FusedLSTM else "gru": refused})
    got = _outputs_and_grads(module, x)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_a_stack_with_dropout_in_training_runs_layer_by_layer(patch_backend):
    """Inter-layer dropout (training) is drawn between the layers in Python: no stack call."""
    def refused(*args):
        raise AssertionError("the stack ran with dropout active")

    module = FusedLSTM(3, 4, num_layers=2, dropout=0.5, backend="cpp")
    patch_backend("cpp", stack=refused, padded=refused)
    out, _ = module(torch.randn(5, 2, 3))
    assert out.shape == (5, 2, 4)
    with pytest.raises(AssertionError, match="the stack ran"):
        module.eval()(torch.randn(5, 2, 3))  # eval: no dropout, the stack


def _spy_padded(patch_backend) -> list:
    """The cpp backend's padded calls (the layers' common call), recorded as they run."""
    calls = []
    padded = patch_backend("cpp", padded=lambda *args: calls.append(args[0]) or padded(*args)).padded
    return calls


PADDED_CONFIGS = {
    "one_layer": dict(num_layers=1),
    "three_bidirectional": dict(num_layers=3, bidirectional=True),
    "no_bias_eval_dropout": dict(num_layers=2, bias=False, dropout=0.5),  # dropout in eval mode: none
}
PADDED_CASES = [(layer, config) for layer in (FusedLSTM, FusedGRU) for config in PADDED_CONFIGS.values()]
PADDED_CASES.append((FusedLSTM, dict(num_layers=2, bidirectional=True, proj_size=2)))  # torch.nn.GRU has no projection
PADDED_IDS = [f"{layer.__name__}-{name}" for layer in (FusedLSTM, FusedGRU) for name in PADDED_CONFIGS]
PADDED_IDS.append("FusedLSTM-projected")


@pytest.mark.parametrize("layer, config", PADDED_CASES, ids=PADDED_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_the_common_call_runs_padded_as_the_general_path_does(layer, config, dtype, patch_backend):
    """A padded time-major batch, from zero states or from given ones (the layers' common
    call), takes the extension's padded entry in one step from Python; outputs, states and
    every gradient (the initial states' too) equal the general path's (the stack's call)
    bit for bit, a non-contiguous input's too."""
    torch.manual_seed(0)
    module = layer(3, 4, backend="cpp", dtype=dtype, **config).train("dropout" not in config)
    LD, P = module.num_layers * module.num_directions, module.output_size
    shapes = [(LD, 2, P), (LD, 2, 4)][: module.cell.num_states]
    given = [torch.randn(shape, dtype=dtype, requires_grad=True) for shape in shapes]
    hx = tuple(given) if len(given) == 2 else given[0]
    strided = torch.randn(2, 5, 3, dtype=dtype).transpose(0, 1).requires_grad_()
    x = torch.randn(5, 2, 3, dtype=dtype, requires_grad=True)
    calls = _spy_padded(patch_backend)
    cases = [(x, None), (strided, None), (x, hx)]
    got = [_outputs_and_grads(module, *case) for case in cases]
    assert calls == [module.cell.name] * 3
    patch_backend("cpp", padded=None)  # the general path
    for case, results in zip(cases, got, strict=True):
        for g, w in zip(results, _outputs_and_grads(module, *case), strict=True):
            assert torch.equal(g, w)
    assert len(calls) == 3


def test_every_other_call_takes_the_general_path(patch_backend):
    """batch_first, a PackedSequence, an unbatched input, checkpointing, dropout in
    training, autocast, and the bad inputs (the general path's clear errors) all go the
    general way; states checked once, as a tuple or a list, go the padded way."""
    module = FusedLSTM(3, 4, num_layers=2, backend="cpp")
    x = torch.randn(5, 2, 3)
    calls = _spy_padded(patch_backend)
    module(x[:, 0])
    module(torch.nn.utils.rnn.pack_padded_sequence(x, [5, 3]))
    FusedLSTM(3, 4, batch_first=True, backend="cpp")(x)
    FusedLSTM(3, 4, checkpoint_chunk_size=2, backend="cpp")(x.requires_grad_())
    FusedLSTM(3, 4, num_layers=2, dropout=0.5, backend="cpp")(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        module(x)
    with pytest.raises(ValueError, match="input: dtype torch.float64 does not match"):
        module(x.double())
    with pytest.raises(ValueError, match=r"hx: expected c_0 of shape \(2, 2, 4\), got \(2, 3, 4\)"):
        module(x, (torch.zeros(2, 2, 4), torch.zeros(2, 3, 4)))
    with pytest.raises(TypeError, match="hx: expected h_0 of dtype torch.float32 like the input"):
        module(x, (torch.zeros(2, 2, 4, dtype=torch.float64), torch.zeros(2, 2, 4)))
    with pytest.raises(TypeError, match=r"hx: FusedLSTM expects a tuple \(h_0, c_0\)"):
        module(x, torch.zeros(2, 2, 4))
    assert calls == []
    module(x)
    module(x, (torch.zeros(2, 2, 4), torch.zeros(2, 2, 4)))
    module(x, [torch.zeros(2, 2, 4), torch.zeros(2, 2, 4)])
    assert calls == ["lstm", "lstm", "lstm"]


@pytest.mark.parametrize("layer", [FusedLSTM, FusedGRU])
def test_a_layer_refuses_forward_mode_ad_on_the_common_call(layer, patch_backend):
    """A dual input in the common call's shape (padded, zero states) is declined by the
    padded entry and refused by the Python Function with torch's error, under no_grad
    too, rather than run without its tangent."""
    import torch.autograd.forward_ad as fwAD

    module = layer(3, 4, num_layers=2, backend="cpp")
    x = torch.randn(5, 2, 3)
    calls = _spy_padded(patch_backend)
    with torch.no_grad(), fwAD.dual_level():
        with pytest.raises(NotImplementedError, match="jvp"):
            module(fwAD.make_dual(x, torch.ones_like(x)))
    assert calls == [module.cell.name]  # asked, and declined


def test_weights_of_several_dtypes_take_the_per_layer_path(patch_backend):
    """A layer whose weights a parametrization (unsafe=True) turns to float64 runs on the
    per-layer path, which converts its input, as the general path does: the common
    call declines rather than fail in the extension's dtype check."""
    class Double(torch.nn.Module):
        def forward(self, w):
            return w.double()

    torch.manual_seed(0)
    module = FusedLSTM(3, 4, num_layers=2, backend="cpp")
    for name in ("weight_ih_l1", "weight_hh_l1", "bias_ih_l1", "bias_hh_l1"):
        torch.nn.utils.parametrize.register_parametrization(module, name, Double(), unsafe=True)
    x = torch.randn(5, 2, 3)
    out, (h, c) = module(x)
    assert out.dtype == h.dtype == c.dtype == torch.float64
    patch_backend("cpp", padded=None)  # the general path
    assert torch.equal(out, module(x)[0])


@pytest.mark.parametrize("mode", ["inference_mode", "no_grad_bf16"])
@pytest.mark.parametrize("layer", [FusedLSTM, FusedGRU])
def test_a_stack_without_a_graph(layer, mode):
    """Under inference_mode, and under no_grad with bf16 autocast, the stack's call records
    nothing and gives torch.nn's outputs (inference tensors under inference_mode)."""
    torch.manual_seed(0)
    module = layer(4, 5, num_layers=2, bidirectional=True, backend="cpp")
    x = torch.randn(6, 3, 4)
    if mode == "inference_mode":
        with torch.inference_mode():
            (out, _), (want, _) = module(x), module.to_torch()(x)
        assert out.is_inference() and out.grad_fn is None
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    else:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out, states = module(x)
        assert out.dtype == torch.bfloat16 and out.grad_fn is None and out.shape == (6, 3, 10)
        torch.testing.assert_close(out.float(), module.to_torch()(x)[0].detach(), rtol=0.05, atol=0.05)
