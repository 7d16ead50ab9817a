"""Gradient checkpointing over time in the fused layers: same numbers, far less memory."""
from __future__ import annotations

import math

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from layer_helpers import outputs_and_grads, random_initial_state
from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.bench.baselines import CellLoop
from lightning_rnn.kernels.dispatch import available_backends
from lightning_rnn.kernels.precision import Precision
from lightning_rnn.kernels.checkpointing import chunk_length, split_steps
from lightning_rnn.kernels.steps import Steps
from lightning_rnn.utils.memory import saved_tensor_bytes

BACKENDS = available_backends("cpu")
CELLS = {"lstm": FusedLSTM, "gru": FusedGRU}
CASES = {
    "one_layer": dict(),
    "three_layers": dict(num_layers=3),
    "three_layers_dropout": dict(num_layers=3, dropout=0.4),
    "bidirectional_given_state": dict(num_layers=2, bidirectional=True, given_state=True),
    "packed_given_state": dict(num_layers=3, packed=True, given_state=True),
    "packed_bidirectional_dropout": dict(num_layers=2, bidirectional=True, packed=True, dropout=0.3),
    "batch_first_no_bias": dict(num_layers=2, batch_first=True, bias=False),
}
PROJECTED_CASES = {  # LSTM only (proj_size): h has 2 columns, c has H
    "projected_three_layers_dropout": dict(num_layers=3, dropout=0.4, proj_size=2),
    "projected_packed_bidirectional_given_state": dict(
        num_layers=2, bidirectional=True, packed=True, given_state=True, proj_size=2
    ),
}
CELL_CASES = [(cell, name) for cell in CELLS for name in CASES] + [("lstm", name) for name in PROJECTED_CASES]
I, H, T, B = 3, 5, 11, 4


def _forward_backward(layer, case, chunk_size, x, hx):
    layer.checkpoint_chunk_size = chunk_size
    inp = x
    if case.get("packed"):
        inp = pack_padded_sequence(x, torch.tensor([T, 3, 7, 1]), batch_first=layer.batch_first, enforce_sorted=False)
    torch.manual_seed(1)  # same dropout masks in every run
    out, states, grads = outputs_and_grads(layer, x, inp, hx)
    return [out, *states, *grads]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell, case_name", CELL_CASES)
def test_same_outputs_and_gradients_float64(cell, case_name, backend):
    case = (CASES | PROJECTED_CASES)[case_name]
    keys = ("num_layers", "bidirectional", "dropout", "batch_first", "bias", "proj_size")
    config = {k: case[k] for k in keys if k in case}
    layer = CELLS[cell](I, H, **config, backend=backend).double().train()
    x = torch.randn(*((B, T) if layer.batch_first else (T, B)), I, dtype=torch.float64, requires_grad=True)
    hx = random_initial_state(layer, B) if case.get("given_state") else None
    expected = _forward_backward(layer, case, None, x, hx)
    for chunk_size in (1, "sqrt", T + 5):  # 11 chunks, 3 (4 + 4 + 3 steps), 1
        got = _forward_backward(layer, case, chunk_size, x, hx)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_chunk_size_validation_and_sqrt():
    with pytest.raises(ValueError, match="checkpoint_chunk_size: expected None, 'sqrt' or an int >= 1, got 0"):
        FusedLSTM(2, 3, checkpoint_chunk_size=0)
    layer = FusedGRU(2, 3, checkpoint_chunk_size="sqrt")
    assert "checkpoint_chunk_size='sqrt'" in repr(layer)
    layer.checkpoint_chunk_size = "half"  # a plain attribute: checked when used
    with pytest.raises(ValueError, match="checkpoint_chunk_size"):
        layer(torch.randn(4, 1, 2))
    assert chunk_length("sqrt", 50) == 8 and chunk_length("sqrt", 10_000) == 100 and chunk_length(None, 9) is None


def test_chunk_size_may_be_a_numpy_int():
    """As the layer's sizes may (it was refused as "expected ... an int >= 1, got np.int64(4)")."""
    np = pytest.importorskip("numpy")
    layer = FusedLSTM(2, 3, checkpoint_chunk_size=np.int64(4))
    assert layer.checkpoint_chunk_size == 4 and type(layer.checkpoint_chunk_size) is int


def test_chunks_cover_packed_steps_in_visiting_order():
    steps = Steps.from_batch_sizes(torch.tensor([4, 3, 3, 2, 1]), reverse=True)
    chunks = split_steps(steps, 2)
    assert [(c.steps.start, c.steps.stop, c.rows.start, c.rows.stop, c.batch) for c in chunks] == [
        (4, 5, 12, 13, 1), (2, 4, 7, 12, 3), (0, 2, 0, 7, 4)]
    # as few chunks as the length allows, lengths differing by at most one
    sizes = [c.steps.stop - c.steps.start for c in split_steps(Steps.from_batch_sizes(torch.full((50,), 2), False), 8)]
    assert sizes == [8, 7, 7, 7, 7, 7, 7]
    sizes = [c.steps.stop - c.steps.start for c in split_steps(Steps.from_batch_sizes(torch.full((9,), 2), False), 3)]
    assert sizes == [3, 3, 3]


def test_no_checkpointing_without_grad():
    layer = FusedLSTM(3, 8, num_layers=2, checkpoint_chunk_size=2)
    x = torch.randn(9, 2, 3)
    with torch.no_grad():
        out = layer(x)[0]
    layer.checkpoint_chunk_size = None
    torch.testing.assert_close(out, layer(x)[0].detach(), rtol=0, atol=0)


@pytest.mark.parametrize("cell", list(CELLS))
def test_saves_far_less_than_without(cell):
    layer = CELLS[cell](16, 32, num_layers=3)
    x = torch.randn(64, 4, 16, requires_grad=True)
    plain = saved_tensor_bytes(lambda: layer(x)[0], exclude=layer)
    layer.checkpoint_chunk_size = "sqrt"
    ckpt = saved_tensor_bytes(lambda: layer(x)[0], exclude=layer)
    # float32: the input (64*4*16), the zero initial state shared by all layers (3*4*32),
    # and the states at the 7 later chunk boundaries: 3 layers x num_states x (4*32)
    expected = 4 * (64 * 4 * 16 + 3 * 4 * 32 + 7 * 3 * layer.cell.num_states * 4 * 32)
    assert ckpt == expected
    assert ckpt < plain / 6


def test_seven_times_less_than_the_naive_cell_loop():
    """torch-rnn's 7x at a smaller size: 3 layers, H = I = 128, batch 10, T = 50."""
    layer = FusedLSTM(128, 128, num_layers=3, checkpoint_chunk_size="sqrt")
    loop = CellLoop.like(layer)
    x = torch.randn(50, 10, 128, requires_grad=True)
    ours = saved_tensor_bytes(lambda: layer(x)[0], exclude=layer)
    naive = saved_tensor_bytes(lambda: loop(x), exclude=loop)
    assert naive >= 7 * ours


def test_memory_grows_like_sqrt_T():
    layer = FusedLSTM(1, 8, num_layers=2, checkpoint_chunk_size="sqrt")
    saved = {}
    for T_ in (100, 2500):
        x = torch.randn(T_, 2, 1, requires_grad=True)
        saved[T_] = saved_tensor_bytes(lambda: layer(x)[0], exclude=layer) - x.numel() * 4
    exponent = math.log(saved[2500] / saved[100]) / math.log(25)
    assert 0.45 <= exponent <= 0.55


@pytest.mark.parametrize("cell", list(CELLS))
def test_recomputes_under_the_forward_autocast(cell, monkeypatch):
    """Backward runs outside autocast; the recomputation must still compute in bf16 like the forward."""
    seen = []
    for_call = Precision.for_call.__func__

    def spy(cls, x, weight):
        precision = for_call(cls, x, weight)
        seen.append(precision.compute)
        return precision

    monkeypatch.setattr(Precision, "for_call", classmethod(spy))
    layer = CELLS[cell](8, 16, num_layers=2, checkpoint_chunk_size=4)
    x = torch.randn(12, 3, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)[0]
    assert out.dtype == torch.bfloat16
    forward_calls = len(seen)
    out.float().square().sum().backward()
    assert len(seen) > forward_calls and set(seen) == {torch.bfloat16}


@pytest.mark.skipif("cpp" not in BACKENDS or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"),
                    reason="needs the cpp backend and oneDNN weight packing")
@pytest.mark.parametrize("bidirectional", [False, True])
def test_weights_packed_once_per_pass_and_released(bidirectional, mkl_generic, patch_backend):
    """float32, H >= 192: the chunks of a pass share one packed copy of each weight, emptied
    after it (with panels on, whatever this CPU's default; GEMMs chosen for MKL's Intel or
    generic kernels, kernels/csrc/rnn_blas.h)."""
    from lightning_rnn.kernels import cpp

    ext = cpp.load()
    default = ext.panels_enabled()
    ext.set_panels(True)
    try:
        _check_packed_once_per_pass(bidirectional, mkl_generic, patch_backend, cpp)
    finally:
        ext.set_panels(default)


def _check_packed_once_per_pass(bidirectional, generic, patch_backend, cpp):

    sizes_at_clear, stores = [], []

    class Recording:
        def __init__(self, store):
            self.store = store

        def __enter__(self):
            return self.store.__enter__()

        def __exit__(self, *exc):
            return self.store.__exit__(*exc)

        def clear(self):
            sizes_at_clear.append(len(self.store))
            self.store.clear()

    make = cpp.weight_packs

    layer = FusedLSTM(256, 256, num_layers=2, bidirectional=bidirectional, backend="cpp")
    x = torch.randn(30, 16, 256, requires_grad=True)  # 80 rows per chunk
    expected = outputs_and_grads(layer, x, x, None)
    patch_backend("cpp", weight_packs=lambda: stores.append(Recording(make())) or stores[-1])
    layer.checkpoint_chunk_size = "sqrt"  # 6 chunks of 5 steps
    got = outputs_and_grads(layer, x, x, None)
    calls = 1 if not bidirectional else 4  # the whole stack, or each layer-direction
    layers = 2 if not bidirectional else 1  # per store
    assert len(stores) == calls
    # cleared once after forward: W_hh^T (panels) per layer, and W_ih^T's panels where x W_ih^T
    # runs on them (generic; else in at::mm); once after backward, which also packs W_hh
    # (panels, per-step dG_h W_hh) and, generic, W_ih (panels, dG W_ih; else at::mm)
    forward = backward = 1 + generic
    assert sorted(sizes_at_clear) == [forward * layers] * calls + [(forward + backward) * layers] * calls
    assert all(len(s.store) == 0 for s in stores)
    # float32 through oneDNN's packed GEMMs (checkpointed) vs MKL's at 5-step chunks: rounding only
    for a, b in zip([got[0], *got[1], *got[2]], [expected[0], *expected[1], *expected[2]], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif("cpp" not in BACKENDS, reason="needs the cpp backend")
@pytest.mark.parametrize("cell", list(CELLS))
def test_kernel_sums_the_chunks_weight_gradients_in_place(cell, monkeypatch):
    """Every chunk after the first of a backward pass adds its weight gradients into the
    pass's running sums (no fresh gradient per chunk); the sums equal the plain gradients."""
    from lightning_rnn.kernels.grad_sink import GradSink

    given = []
    into = GradSink.into

    def spy(self, w, dtype):
        total = into(self, w, dtype)
        given.append(total is not None)
        return total

    layer = CELLS[cell](I, H, num_layers=2, backend="cpp").double()
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    expected = outputs_and_grads(layer, x, x, None)
    monkeypatch.setattr(GradSink, "into", spy)
    layer.checkpoint_chunk_size = "sqrt"  # 3 chunks of the 2-layer stack
    got = outputs_and_grads(layer, x, x, None)
    assert len(given) == 3 * 2 * 2 and sum(given) == 2 * 2 * 2  # W_ih, W_hh of 2 layers, 3 chunks
    for a, b in zip([got[0], *got[1], *got[2]], [expected[0], *expected[1], *expected[2]], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_retained_graph_after_an_aborted_pass_and_twice(backend, monkeypatch):
    """A backward pass that fails halfway leaves no partial sums behind: the next pass over
    the retained graph starts afresh, and a second pass adds to .grad like torch.nn."""
    from lightning_rnn.kernels.grad_sink import GradSink

    layer = FusedLSTM(I, H, num_layers=2, bidirectional=True, backend=backend).double()
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    layer(x)[0].square().sum().backward()
    expected = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    layer.checkpoint_chunk_size = 4  # 3 chunks per layer-direction
    loss = layer(x)[0].square().sum()
    calls, keep = [], GradSink.keep

    def failing(self, w, grad, owned=False):
        calls.append(w)
        if len(calls) == 5:
            raise RuntimeError("interrupted")
        return keep(self, w, grad, owned)

    monkeypatch.setattr(GradSink, "keep", failing)
    with pytest.raises(RuntimeError, match="interrupted"):
        loss.backward(retain_graph=True)
    monkeypatch.setattr(GradSink, "keep", keep)
    layer.zero_grad()
    loss.backward(retain_graph=True)
    for p, e in zip(layer.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, e, rtol=1e-10, atol=1e-12)
    loss.backward()
    for p, e in zip(layer.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, 2 * e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cell", list(CELLS))
def test_bf16_checkpointed_gradients_match_unchunked(cell, widen):
    """Under autocast the kernels compute in bf16 and the weights stay fp32: the chunks' fp32
    weight gradients are summed (not into the kernel's GEMM) and match the unchunked layer's."""
    torch.manual_seed(0)
    layer = CELLS[cell](8, 16, num_layers=2)
    x = torch.randn(12, 3, 8, requires_grad=True)
    grads = []
    for chunk in (None, 4):
        layer.checkpoint_chunk_size = chunk
        layer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(x)[0]
        out.float().square().sum().backward()
        grads.append([p.grad.clone() for p in layer.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_checkpointed_forward_is_the_unchunked_one_exactly(cell, backend, widen):
    """The states carried from chunk to chunk are those the next step reads (the GRU's h in
    fp32, not rounded to bf16 at each boundary), so the chunks compute what one pass does."""
    torch.manual_seed(0)
    layer = CELLS[cell](8, 16, num_layers=2, backend=backend)
    x = torch.randn(12, 3, 8, requires_grad=True)
    results = []
    for chunk in (None, 4, 1):
        layer.checkpoint_chunk_size = chunk
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, state = layer(x)
        results.append([out, *(state if isinstance(state, tuple) else (state,))])
    for got in results[1:]:
        for a, b in zip(got, results[0], strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)
    assert results[0][1].dtype == (torch.bfloat16 if cell == "lstm" else torch.float32)  # h_n


@pytest.mark.parametrize("bidirectional", [False, True], ids=["unidirectional", "bidirectional"])
@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_checkpointed_layer_saves_its_input_in_bf16(cell, backend, bidirectional):
    """Under autocast the chunks save the layer's input as the kernels read it (bf16), not the
    fp32 tensor given, which dominated what they save: unidirectional, 0.93x (LSTM) and 1.00x
    (GRU) of the fp32 checkpointed layer's bytes, now 0.59x and 0.60x (the boundary states
    stay fp32 by design, the LSTM's h aside)."""
    torch.manual_seed(0)
    layer = CELLS[cell](32, 64, bidirectional=bidirectional, backend=backend, checkpoint_chunk_size=8)
    x = torch.randn(64, 16, 32, requires_grad=True)
    fp32 = saved_tensor_bytes(lambda: layer(x)[0], exclude=layer)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = saved_tensor_bytes(lambda: layer(x)[0], exclude=layer)
    assert bf16 <= fp32 - 2 * x.numel()  # at least the input's 2 bytes per element less


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_layer_called_twice_in_one_graph(backend):
    """Shared weights (the same layer on two inputs): each call sums its own chunks'
    weight gradients, and autograd adds the two calls' sums, as without checkpointing."""
    layer = FusedGRU(I, H, num_layers=2, backend=backend).double()
    x1 = torch.randn(T, B, I, dtype=torch.float64)
    x2 = torch.randn(T + 3, B, I, dtype=torch.float64)
    grads = []
    for chunk in (None, 3):
        layer.checkpoint_chunk_size = chunk
        layer.zero_grad()
        (layer(x1)[0].square().sum() + layer(x2)[1].sum()).backward()
        grads.append([p.grad.clone() for p in layer.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("tied", [("bias_ih_l0", "bias_hh_l0"), ("weight_ih_l1", "weight_hh_l1")], ids=["biases", "weights"])
@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_tied_weights_get_both_gradients(backend, cell, tied):
    """Two weights of a layer tied to one Parameter: checkpointed chunks give it the sum of
    both uses, as torch.nn does (the LSTM's tied biases got one of the two)."""
    reference = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](H, H, num_layers=2, dtype=torch.float64)
    layer = CELLS[cell].from_torch(reference, backend=backend)
    layer.checkpoint_chunk_size = 3
    for module in (reference, layer):
        setattr(module, tied[1], getattr(module, tied[0]))
    x = torch.randn(T, B, H, dtype=torch.float64)
    grads = [torch.autograd.grad(m(x)[0].square().sum(), list(m.parameters())) for m in (layer, reference)]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
