"""FusedLSTM/FusedGRU against torch.nn in float64: outputs, states and every gradient.

Written once, run for every backend that loads on this machine (the reference, the
compiled CPU kernel, ``"torch"``).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from layer_helpers import outputs_and_grads, random_initial_state
from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels.dispatch import available_backends

BACKENDS = available_backends("cpu") + ["torch"]
CELLS = {"lstm": (FusedLSTM, nn.LSTM), "gru": (FusedGRU, nn.GRU)}
CASES = {
    "one_layer": dict(),
    "three_layers_bidirectional": dict(num_layers=3, bidirectional=True),
    "batch_first_no_bias": dict(num_layers=2, batch_first=True, bias=False),
    "packed_unsorted_bidirectional": dict(num_layers=2, bidirectional=True, packed=True),
    "packed_batch_first_given_state": dict(num_layers=3, batch_first=True, packed=True, given_state=True),
    "unbatched_given_state": dict(num_layers=2, bidirectional=True, unbatched=True, given_state=True),
    "given_state": dict(num_layers=2, bidirectional=True, given_state=True),
    "single_step": dict(num_layers=2, T=1, given_state=True),
    "batch_of_one_packed": dict(B=1, packed=True, bidirectional=True),
    "dropout_one_in_training": dict(num_layers=3, dropout=1.0, train=True),
    # masks drawn from the CPU generator as torch.nn draws them, seeded alike before each forward
    "dropout_half_in_training": dict(num_layers=3, dropout=0.5, train=True),
    "dropout_packed_bidirectional_batch_first": dict(num_layers=2, dropout=0.3, bidirectional=True, packed=True,
                                                     batch_first=True, given_state=True, train=True),
}
# torch.nn.LSTM's proj_size (LSTM only): h and each direction's output have P columns, c keeps H.
PROJECTED_CASES = {
    "projected_one_layer": dict(proj_size=2),
    "projected_three_layers_bidirectional_given_state": dict(
        num_layers=3, bidirectional=True, given_state=True, proj_size=2
    ),
    "projected_batch_first_no_bias": dict(num_layers=2, batch_first=True, bias=False, proj_size=4),
    "projected_packed_unsorted_bidirectional_given_state": dict(
        num_layers=2, bidirectional=True, packed=True, given_state=True, proj_size=1
    ),
    "projected_unbatched_given_state": dict(num_layers=2, unbatched=True, given_state=True, proj_size=3),
    "projected_dropout_one_in_training": dict(num_layers=3, dropout=1.0, train=True, proj_size=2),
    "projected_dropout_in_training_bidirectional": dict(num_layers=3, dropout=0.25, bidirectional=True, train=True,
                                                        proj_size=2),
}
CELL_CASES = [(cell, name) for cell in CELLS for name in CASES] + [("lstm", name) for name in PROJECTED_CASES]
#: Cases whose masks are random (0 < dropout < 1): a layer on the GPU draws them from the
#: CUDA generator, which no CPU run of torch.nn can share.
RANDOM_MASK_CASES = [(cell, name) for cell, name in CELL_CASES
                     if 0 < (CASES | PROJECTED_CASES)[name].get("dropout", 0) < 1]
I, H = 3, 5
SEED = 7


def _make_input(case, batch_first):
    T, B = case.get("T", 6), case.get("B", 4)
    shape = (T, I) if case.get("unbatched") else ((B, T, I) if batch_first else (T, B, I))
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    if not case.get("packed"):
        return x, x
    lengths = torch.randint(1, T + 1, (B,))
    lengths[-1] = T  # unsorted, and the longest last
    return x, pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell, case_name", CELL_CASES)
def test_matches_torch_nn_float64(cell, case_name, backend):
    _check_against_torch_nn(cell, case_name, backend)


@pytest.mark.parametrize("backend", available_backends("cpu"))
@pytest.mark.parametrize("cell, case_name", RANDOM_MASK_CASES)
def test_inter_layer_dropout_matches_torch_nn_checkpointed(cell, case_name, backend):
    """Gradient checkpointing draws the masks of every layer before the first chunk, in the
    order torch.nn draws them layer after layer: the same masks, and recomputing a chunk in
    backward reuses them rather than drawing again."""
    _check_against_torch_nn(cell, case_name, backend, checkpoint_chunk_size=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("checkpoint_chunk_size", [None, 2], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("backend", ["cuda", "reference"])
@pytest.mark.parametrize("cell, case_name", [case for case in CELL_CASES if case not in RANDOM_MASK_CASES])
def test_cuda_matches_torch_nn_float64(cell, case_name, backend, checkpoint_chunk_size):
    """The layer on the GPU (the cuda kernel, and the reference backend there) against
    torch.nn on the CPU, float64: every case above, plain and gradient-checkpointed."""
    _check_against_torch_nn(cell, case_name, backend, "cuda", checkpoint_chunk_size)


def _check_against_torch_nn(cell, case_name, backend, device="cpu", checkpoint_chunk_size=None):
    """The fused layer on ``device`` against torch.nn on the CPU (float64): outputs, final
    states and every gradient (those of the device's tensors compared on the CPU)."""
    case = (CASES | PROJECTED_CASES)[case_name]
    fused_class, torch_class = CELLS[cell]
    config = dict(num_layers=case.get("num_layers", 1), bias=case.get("bias", True),
                  batch_first=case.get("batch_first", False), dropout=case.get("dropout", 0.0),
                  bidirectional=case.get("bidirectional", False))
    if case.get("proj_size"):
        config["proj_size"] = case["proj_size"]
    ref = torch_class(I, H, **config).double().train(case.get("train", False))
    fused = fused_class.from_torch(ref, backend=backend).train(case.get("train", False)).to(device)
    fused.checkpoint_chunk_size = checkpoint_chunk_size
    assert fused.proj_size == case.get("proj_size", 0)
    x, inp = _make_input(case, config["batch_first"])
    hx = None
    if case.get("given_state"):
        hx = random_initial_state(fused, None if case.get("unbatched") else case.get("B", 4))

    torch.manual_seed(SEED)  # the same dropout masks in both
    out_ref, states_ref, grads_ref = outputs_and_grads(ref, x, inp, hx)
    inp_dev, hx_dev = inp.to(device), hx
    if hx is not None:
        hx_dev = tuple(h.to(device) for h in hx) if isinstance(hx, tuple) else hx.to(device)
    torch.manual_seed(SEED)
    out, states, grads = outputs_and_grads(fused, x, inp_dev, hx_dev)
    if 0 < config["dropout"] < 1:  # the masks matter: another seed, other masks, another output
        torch.manual_seed(SEED + 1)
        assert not torch.allclose(outputs_and_grads(ref, x, inp, hx)[0], out_ref)
    out, states, grads = out.cpu(), [s.cpu() for s in states], [g.cpu() for g in grads]

    torch.testing.assert_close(out, out_ref, rtol=1e-10, atol=1e-12)
    for s, s_ref in zip(states, states_ref, strict=True):
        torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-12)
    names = ["input"] + (["h0", "c0"][: fused.cell.num_states] if hx is not None else [])
    names += [n for n, _ in fused.named_parameters()]
    for name, g, g_ref in zip(names, grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-11, msg=lambda m: f"grad of {name}: {m}")


@pytest.mark.parametrize("cell", list(CELLS))
def test_inter_layer_dropout_only_in_training(cell):
    fused_class, _ = CELLS[cell]
    layer = fused_class(I, H, num_layers=2, dropout=0.5, backend="reference").double()
    x = torch.randn(7, 4, I, dtype=torch.float64)
    layer.eval()
    eval_a, eval_b = layer(x)[0], layer(x)[0]
    torch.testing.assert_close(eval_a, eval_b)
    layer.train()
    assert not torch.allclose(layer(x)[0], eval_a)


HALF_CASES = {
    "bidirectional": dict(num_layers=2, bidirectional=True),
    "packed_checkpointed": dict(num_layers=2, packed=True, checkpoint_chunk_size=2),
    "bidirectional_checkpointed": dict(bidirectional=True, checkpoint_chunk_size=2),
}


@pytest.mark.parametrize("backend", available_backends("cpu"))
@pytest.mark.parametrize("case_name", list(HALF_CASES))
@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("weights, autocast", [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)])
def test_half_layer_under_the_other_half_autocast(cell, case_name, backend, weights, autocast):
    """A .half() layer inside torch.autocast("cpu") (bf16 by default) runs as torch.nn's does: it
    computes in its weights' dtype, as without autocast. CPU autocast refuses to join fp16
    tensors under bf16 (and bf16 under fp16), which the layer's cat/stack of its directions,
    layers and chunks ran into ("Unexpected floating ScalarType in at::autocast::prioritize")."""
    case = dict(HALF_CASES[case_name])
    packed = case.pop("packed", False)
    torch.manual_seed(0)
    layer = CELLS[cell][0](I, H, **case, backend=backend).to(weights)
    x = torch.randn(7, 4, I, requires_grad=True)
    results = []
    for enabled in (False, True):
        inp = x if enabled else x.to(weights)  # under autocast the layer casts the fp32 input itself
        if packed:
            inp = pack_padded_sequence(inp, torch.tensor([2, 3, 7, 1]), enforce_sorted=False)
        with torch.autocast("cpu", dtype=autocast, enabled=enabled):
            out, state = layer(inp)
        out = out.data if packed else out
        states = state if isinstance(state, tuple) else (state,)
        weighted = out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)
        loss = weighted.sum() + sum(s.float().sum() for s in states)  # backward outside autocast
        results.append([out, *states, *torch.autograd.grad(loss, [x, *layer.parameters()])])
    for got, expected in zip(*results[::-1], strict=True):
        assert got.dtype == expected.dtype and torch.equal(got, expected)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_another_default_device_changes_nothing(cell, backend, packed):
    """Under torch.set_default_device (a model set up for the GPU, say) the layer computes on
    its input's device as torch.nn does: its own tensors (the batch sizes of a full batch,
    which the kernels read on the host) are not put on the default device. Here the default
    is meta, which holds no data, the input on the CPU; forward and backward run under it."""
    fused_class, _ = CELLS[cell]
    chunk = None if backend == "torch" else 2  # gradient checkpointing too
    layer = fused_class(I, H, num_layers=2, backend=backend, dtype=torch.float64, checkpoint_chunk_size=chunk)
    x, inp = _make_input({"packed": packed}, batch_first=False)
    results = []
    for module, default_device in ((layer.to_torch(), "cpu"), (layer, "meta")):
        with torch.device(default_device):
            out, state = module(inp)
            out = out.data if packed else out
            loss = out.sum() + sum(s.sum() for s in (state if isinstance(state, tuple) else (state,)))
            results.append((out, *torch.autograd.grad(loss, [x, *module.parameters()], retain_graph=packed)))
    for ours, theirs in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-11)
