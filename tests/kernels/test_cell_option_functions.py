"""torch.autograd.gradcheck of the cell options' autograd Functions in float64: the reference
backend's hand-written backward and the compiled backend's, each option alone and all
together, packed and reversed, with the LSTM's projection; gradgradcheck of the reference's
create_graph path."""
import pytest
import torch

from lightning_rnn.kernels import dispatch
from lightning_rnn.kernels.cell import CellExtras

BATCH_SIZES = torch.tensor([3, 3, 2, 1])
N, B, I, H = 9, 3, 2, 3
OPTIONS = {
    "layer_norm": dict(norm=True),
    "zoneout_train": dict(zoneout=(0.3, 0.4), masks=True),
    "zoneout_eval": dict(zoneout=(0.3, 0.4)),
    "recurrent_dropout": dict(recurrent=0.3),
    "weight_drop": dict(weight=0.4),
    "all": dict(norm=True, zoneout=(0.2, 0.3), masks=True, recurrent=0.2, weight=0.3),
}
BACKENDS = dispatch.available_backends("cpu")


def _leaf(*shape, gen):
    return torch.randn(*shape, dtype=torch.float64, generator=gen).requires_grad_()


def _extras(cell: str, P: int, options: dict, gen) -> CellExtras:
    G = 4 if cell == "lstm" else 3
    norm = ()
    if options.get("norm"):
        widths = (G * H,) * 4 + ((H, H) if cell == "lstm" else ())
        norm = tuple(_leaf(w, gen=gen) for w in widths)
    zoneout = options.get("zoneout", (0.0, 0.0))
    zoneout = zoneout if cell == "lstm" else (0.0, zoneout[1])
    masks = options.get("masks")
    return CellExtras(
        norm=norm,
        recurrent_keep=(torch.rand(B, P, generator=gen) < 0.7) if options.get("recurrent") else None,
        recurrent_p=options.get("recurrent", 0.0), zoneout=zoneout,
        keep_c=(torch.rand(N, H, generator=gen) < 0.3) if masks and cell == "lstm" else None,
        keep_h=(torch.rand(N, P, generator=gen) < 0.3) if masks else None,
        weight_keep=(torch.rand(G * H, P, generator=gen) < 0.6) if options.get("weight") else None,
        weight_p=options.get("weight", 0.0),
    )


def _args(cell: str, P: int | None, options: dict, reverse: bool):
    gen = torch.Generator().manual_seed(0)
    G, Ph = (4 if cell == "lstm" else 3), P or H
    x, h0 = _leaf(N, I, gen=gen), _leaf(B, Ph, gen=gen)
    w_ih, w_hh, b_ih, b_hh = _leaf(G * H, I, gen=gen), _leaf(G * H, Ph, gen=gen), _leaf(G * H, gen=gen), _leaf(
        G * H, gen=gen)
    extras = _extras(cell, Ph, options, gen)
    if cell == "lstm":
        w_hr = _leaf(Ph, H, gen=gen) if P else None
        return (x, BATCH_SIZES, h0, _leaf(B, H, gen=gen), w_ih, w_hh, b_ih, b_hh, reverse, w_hr,
                *extras.lstm_inputs())
    return (x, BATCH_SIZES, h0, w_ih, w_hh, b_ih, b_hh, reverse, *extras.gru_inputs())


CASES = [("lstm", None), ("lstm", 2), ("gru", None)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("name", OPTIONS)
@pytest.mark.parametrize("cell, P", CASES, ids=["lstm", "lstm_proj", "gru"])
def test_gradcheck(cell, P, name, reverse, backend):
    kernels = dispatch.backend(backend)
    function = kernels.function(cell) if backend == "reference" else _options_function(backend, cell)
    assert torch.autograd.gradcheck(function.apply, _args(cell, P, OPTIONS[name], reverse))


@pytest.mark.parametrize("name", ["layer_norm", "all"])
@pytest.mark.parametrize("cell, P", CASES, ids=["lstm", "lstm_proj", "gru"])
def test_gradgradcheck_of_the_reference(cell, P, name):
    function = dispatch.backend("reference").function(cell)
    assert torch.autograd.gradgradcheck(function.apply, _args(cell, P, OPTIONS[name], True))


def _options_function(backend: str, cell: str):
    """The compiled backend's Function for calls with options (extension/options.py)."""
    from lightning_rnn.kernels.extension.options import options_function

    return options_function(cell, dispatch.backend(backend).load)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("name", OPTIONS)
@pytest.mark.parametrize("cell, P", CASES, ids=["lstm", "lstm_proj", "gru"])
def test_cuda_matches_the_reference(cell, P, name):
    """The CUDA backend's options Function against the reference on the CPU, float64: outputs
    and every gradient (tests/gpu_checks.sh runs this where a GPU is lent)."""
    args = _args(cell, P, OPTIONS[name], True)
    reference = dispatch.backend("reference").function(cell)
    want = _outputs_and_grads(reference, args)
    on_gpu = [a.detach().cuda().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) and a.is_floating_point()
              else a.cuda() if isinstance(a, torch.Tensor) and a.dtype == torch.bool else a for a in args]
    got = _outputs_and_grads(_options_function("cuda", cell), on_gpu)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-9, atol=1e-10)


def _outputs_and_grads(function, args) -> list:
    outputs = function.apply(*args)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    loss = sum((o.double() ** 2).sum() for o in outputs)
    return [o.detach() for o in outputs] + list(torch.autograd.grad(loss, leaves))
