"""The compiled generation loop (kernels/generate.py, csrc/rnn_generate.h) on its own: the
recurrence against the layers' forward, the draw's filters, reproducibility, threads, errors.

How its draws are distributed, and the module-level decoders, are in
tests/modules/test_generation.py."""
import pytest
import torch
from torch import nn

from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels.generate import CompiledDecoder, GenerationWeights, draw

CELLS = {"lstm": FusedLSTM, "gru": FusedGRU}


def language_model(cell="lstm", vocab=11, embedding=7, hidden=12, layers=2, **options):
    """(embedding, rnn, linear): a character model's three parts, float32."""
    torch.manual_seed(1)
    rnn = CELLS[cell](embedding, hidden, layers, batch_first=True, backend="reference", **options)
    return nn.Embedding(vocab, embedding), rnn, nn.Linear(rnn.output_size, vocab)


def forward(parts, ids, state=None):
    """The parts' last logits (B, V) and state after ``ids`` (B, T)."""
    embedding, rnn, linear = parts
    with torch.no_grad():
        out, state = rnn(embedding(ids), state)
        return linear(out[:, -1]), state


def pack(parts, dtype=torch.float32):
    embedding, rnn, linear = parts
    cell = "lstm" if isinstance(rnn, FusedLSTM) else "gru"
    layers = [rnn.layer_weights(k, 0) for k in range(rnn.num_layers)]
    return GenerationWeights.pack(cell, embedding.weight, layers, linear.weight, linear.bias, dtype)


@pytest.mark.parametrize("cell, options", [("lstm", {}), ("gru", {}), ("lstm", {"proj_size": 5}),
                                           ("lstm", {"bias": False}), ("gru", {"bias": False})])
@pytest.mark.parametrize("layers", [1, 3])
def test_the_loop_carries_the_layers_state(cell, options, layers):
    """After generating, the decoder's logits and state are what the layers' forward over the
    whole text gives: the loop's recurrence is the layers' (rnn_cells.h's element math)."""
    parts = language_model(cell, layers=layers, **options)
    prefix = torch.tensor([[1, 4, 2], [3, 3, 0]])
    logits, state = forward(parts, prefix)
    decoder = CompiledDecoder(pack(parts), logits, state, 1.0, None, None, torch.Generator().manual_seed(0))
    ids = torch.cat([decoder.run(5), decoder.run(9)], dim=1)  # (2, 14)
    expected_logits, expected_state = forward(parts, torch.cat([prefix, ids], dim=1))
    torch.testing.assert_close(decoder.logits, expected_logits, atol=1e-5, rtol=1e-5)
    for got, want in zip((decoder.state,) if cell == "gru" else decoder.state,
                         (expected_state,) if cell == "gru" else expected_state):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_greedy_decoding_follows_the_argmax_of_the_forward():
    """At temperature 0 each token is the argmax of the forward's logits over the text so far."""
    parts = language_model("lstm")
    logits, state = forward(parts, torch.tensor([[2]]))
    ids = CompiledDecoder(pack(parts), logits, state, 0.0, None, None, torch.Generator()).run(20)[0]
    text = torch.cat([torch.tensor([2]), ids])
    for t in range(1, len(text)):
        assert forward(parts, text[:t].view(1, -1))[0].argmax().item() == text[t].item()


def test_bfloat16_weights_are_the_float32_loop_on_rounded_weights():
    """bf16 weights change only the weights: the loop with them equals the float32 loop on
    weights rounded to bf16 (the sums stay float32)."""
    parts = language_model("lstm", hidden=40)
    rounded = language_model("lstm", hidden=40)  # the same weights (seeded), to round
    with torch.no_grad():
        for module in rounded[1:]:  # the embedding stays float32 in both
            for p in module.parameters():
                if p.dim() == 2:
                    p.copy_(p.bfloat16().float())
    logits, state = forward(parts, torch.tensor([[3]]))
    half = CompiledDecoder(pack(parts, torch.bfloat16), logits, state, 1.0, None, None,
                           torch.Generator().manual_seed(5))
    full = CompiledDecoder(pack(rounded), logits, state, 1.0, None, None, torch.Generator().manual_seed(5))
    assert torch.equal(half.run(30), full.run(30))
    torch.testing.assert_close(half.logits, full.logits, atol=1e-5, rtol=1e-5)
    assert pack(parts, torch.bfloat16).bytes_per_step < 0.6 * pack(parts).bytes_per_step


def test_the_same_seed_draws_the_same_tokens():
    parts = language_model("gru")
    logits, state = forward(parts, torch.tensor([[1], [2], [3]]))

    def run(seed, top_p=None):
        return CompiledDecoder(pack(parts), logits, state, 0.9, 5, top_p, torch.Generator().manual_seed(seed)).run(40)

    assert torch.equal(run(3), run(3)) and not torch.equal(run(3), run(4))
    assert torch.equal(run(3, 0.8), run(3, 0.8))


@pytest.mark.parametrize("threads", [2], indirect=True)
def test_products_split_over_threads_give_the_same_tokens(threads):
    """Weights of 1 MB and more are split over threads by panels, each summed as on one thread."""
    parts = language_model("lstm", embedding=64, hidden=256, layers=2)  # W of layer 1: 1024 x 512 floats
    logits, state = forward(parts, torch.tensor([[1]]))

    def run():
        decoder = CompiledDecoder(pack(parts), logits, state, 1.0, None, None, torch.Generator().manual_seed(0))
        return decoder.run(25), decoder.logits

    parallel = run()
    torch.set_num_threads(1)
    serial = run()
    assert torch.equal(parallel[0], serial[0]) and torch.equal(parallel[1], serial[1])


def test_draw_filters():
    """Temperature 0: the first of the largest; top_k keeps ties with the k-th; top_p keeps
    tokens of equal probability together (the draw only ever picks a kept token)."""
    generator = torch.Generator().manual_seed(0)
    assert draw(torch.tensor([[1.0, 3.0, 3.0, 0.0]]), temperature=0).item() == 1
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0]]).expand(2000, -1)
    assert set(draw(logits, 1.0, top_k=2, generator=generator).tolist()) == {0, 1, 2}
    probs = torch.tensor([0.4, 0.2, 0.2, 0.1, 0.1])  # top_p 0.5: 0.4 and both 0.2s (0.4 above each)
    drawn = draw(probs.log().expand(4000, -1).contiguous(), 1.0, top_p=0.5, generator=generator)
    assert set(drawn.tolist()) == {0, 1, 2}
    assert set(draw(probs.log().expand(500, -1).contiguous(), 1.0, top_p=0.4, generator=generator).tolist()) == {0}


def test_logits_that_are_not_numbers_are_named():
    with pytest.raises(RuntimeError, match="logits: the model's output holds NaN"):
        draw(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(RuntimeError, match="logits: the model's largest logit is inf"):
        draw(torch.tensor([[0.0, float("inf")]]))


@pytest.mark.parametrize("change, error, message", [
    (dict(cell="rnn"), ValueError, "cell: expected one of lstm, gru, got 'rnn'"),
    (dict(dtype=torch.float16), ValueError, "dtype: expected torch.float32 or torch.bfloat16"),
    (dict(w_out=torch.zeros(11, 12, dtype=torch.float64)), ValueError,
     "w_out: the compiled generation loop takes float32 CPU tensors, got torch.float64 on cpu"),
    (dict(layers=[]), ValueError, "layers: expected at least one layer"),
])
def test_packing_refuses_what_the_loop_cannot_read(change, error, message):
    embedding, rnn, linear = language_model("lstm")
    arguments = dict(cell="lstm", embedding=embedding.weight, layers=[rnn.layer_weights(k, 0) for k in range(2)],
                     w_out=linear.weight, b_out=linear.bias)
    with pytest.raises(error, match=message):
        GenerationWeights.pack(**{**arguments, **change})


def test_the_kernel_names_a_state_that_does_not_fit():
    parts = language_model("lstm")
    logits, (h, c) = forward(parts, torch.tensor([[1]]))
    with pytest.raises(ValueError, match=r"state: expected \(h, c\) for a lstm, got 1 tensors"):
        CompiledDecoder(pack(parts), logits, h, 1.0, None, None, torch.Generator())
    decoder = CompiledDecoder(pack(parts), logits, (h, c[:, :, :5]), 1.0, None, None, torch.Generator())
    with pytest.raises(RuntimeError, match=r"c: expected shape \(2, 1, 12\), got \[2, 1, 5\]"):
        decoder.run(1)
