"""CharLanguageModel.sample's two decoders: the compiled loop against the per-step loop.

Exact where the draw is deterministic (greedy decoding, top_k=1); otherwise the texts of
the two differ under one seed (their random draws differ), so their distributions are
compared: each against the softmax probabilities it is to draw from, and against each
other, by chi-square statistics under a seeded generator (a fixed outcome, no flakiness)
with a bound that a correct draw exceeds with probability 1e-6."""
import copy
import functools
import math
import pickle

import pytest
import torch
from modules_helpers import adam, rnn_factory
from torch import nn

from lightning_rnn import FusedLSTM
from lightning_rnn.kernels import generate
from lightning_rnn.modules import CharLanguageModel
from lightning_rnn.modules.sampling import nucleus, sample_next

VOCAB = "\nabcdefgh "


def model(rnn=None, vocab=VOCAB, **kwargs):
    torch.manual_seed(2)
    return CharLanguageModel(vocab=vocab, embedding_dim=6, rnn=rnn or rnn_factory(hidden_size=12, num_layers=2),
                             optimizer=adam(), val_sample_length=0, **kwargs)


def chi_square_bound(df: int) -> float:
    """The chi-square statistic that df degrees of freedom exceed with probability ~1e-6:
    Wilson and Hilferty's cube-root normal approximation at z = 4.75 (upper tail 1e-6)."""
    return df * (1 - 2 / (9 * df) + 4.75 * math.sqrt(2 / (9 * df))) ** 3


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of ``counts`` against ``probs`` over the tokens of nonzero
    probability, and its degrees of freedom; a count where the probability is 0 is infinite."""
    expected = probs * counts.sum()
    if (counts[probs == 0] > 0).any():
        return math.inf, 1
    kept = probs > 0
    return float(((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum()), int(kept.sum()) - 1


def filtered_probs(logits: torch.Tensor, temperature: float, top_k=None, top_p=None) -> torch.Tensor:
    """What a draw is to follow, computed in float64 from the definitions: softmax(logits / T)
    over the top_k largest, then over the nucleus (tokens with less than top_p above them)."""
    z = logits.double() / temperature
    if top_k is not None:
        z = z.masked_fill(z < z.topk(top_k).values[-1], -math.inf)
    p = torch.softmax(z, dim=-1)
    if top_p is not None:
        above = torch.stack([p[p > q].sum() for q in p])
        p = torch.where(above < top_p, p, torch.zeros_like(p))
    return p / p.sum()


SETTINGS = [(1.0, None, None), (0.7, 4, None), (1.3, None, 0.8), (1.5, 6, 0.9), (2.0, 8, 0.7)]  # 12, 4, 4, 5, 4 kept


@pytest.mark.parametrize("temperature, top_k, top_p", SETTINGS)
@pytest.mark.parametrize("drawer", ["compiled", "python"])
def test_draws_follow_the_filtered_softmax(drawer, temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(12) * 2
    rows = logits.expand(40_000, -1).contiguous()
    generator = torch.Generator().manual_seed(1)
    if drawer == "compiled":
        ids = generate.draw(rows, temperature, top_k, top_p, generator)
    else:
        ids = sample_next(rows, temperature, top_k, generator, top_p)
    counts = torch.bincount(ids, minlength=12).double()
    statistic, df = chi_square(counts, filtered_probs(logits, temperature, top_k, top_p))
    assert statistic < chi_square_bound(df)


def test_the_statistic_tells_a_wrong_temperature():
    """The bound is not loose: draws at temperature 1.1 fail against temperature 1's probabilities."""
    torch.manual_seed(0)
    logits = torch.randn(12) * 2
    ids = generate.draw(logits.expand(40_000, -1).contiguous(), 1.1, generator=torch.Generator().manual_seed(1))
    statistic, df = chi_square(torch.bincount(ids, minlength=12).double(), filtered_probs(logits, 1.0))
    assert statistic > chi_square_bound(df)


def test_nucleus_keeps_ties_together():
    probs = torch.tensor([[0.1, 0.2, 0.4, 0.2, 0.1]])
    for top_p, kept in [(0.5, [1, 2, 3]), (0.4, [2]), (0.41, [1, 2, 3]), (0.81, [0, 1, 2, 3, 4])]:
        assert torch.equal(nucleus(probs, top_p) > 0, torch.isin(torch.arange(5), torch.tensor(kept)).view(1, -1))
    assert torch.equal(nucleus(probs, 0.5)[0, 1:4], probs[0, 1:4])


@pytest.mark.parametrize("decoder", ["compiled", "loop"])
def test_the_first_character_follows_the_models_probabilities(decoder):
    """num_samples texts of one character after a prefix: one draw each from the prefix's logits."""
    lm = model()
    texts = lm.sample("ab", 1, temperature=0.8, top_p=0.9, seed=0, num_samples=20_000, decoder=decoder)
    counts = torch.bincount(torch.tensor([lm.vocab.chars.index(t[-1]) for t in texts]), minlength=len(VOCAB))
    with torch.no_grad():
        logits = lm(lm.vocab.encode("ab").view(1, -1))[0][0, -1]
    statistic, df = chi_square(counts.double(), filtered_probs(logits, 0.8, top_p=0.9))
    assert statistic < chi_square_bound(df)


def test_pairs_of_characters_are_distributed_alike():
    """The second character depends on the first through the recurrence: the joint counts of
    the two decoders' pairs agree (a two-sample chi-square over the 16 pairs of 4 characters)."""
    lm = model(vocab="abcd")
    pairs = {}
    for decoder in ("compiled", "loop"):
        texts = lm.sample("a", 2, seed=3, num_samples=20_000, decoder=decoder)
        ids = torch.tensor([[lm.vocab.chars.index(c) for c in t[1:]] for t in texts])
        pairs[decoder] = torch.bincount(ids[:, 0] * 4 + ids[:, 1], minlength=16).double()
    a, b = pairs["compiled"], pairs["loop"]
    seen = (a + b) > 0
    statistic = float(((a - b)[seen] ** 2 / (a + b)[seen]).sum())
    assert statistic < chi_square_bound(int(seen.sum()) - 1)


RNNS = {
    "fused_lstm": rnn_factory("lstm", hidden_size=12, num_layers=2),
    "fused_gru": rnn_factory("gru", hidden_size=12, num_layers=3),
    "projection": rnn_factory("lstm", hidden_size=12, num_layers=2, proj_size=5),
    "no_bias": rnn_factory("gru", hidden_size=12, bias=False),
    "torch_lstm": functools.partial(nn.LSTM, hidden_size=12, num_layers=2),
    "torch_gru": functools.partial(nn.GRU, hidden_size=12),
}


@pytest.mark.parametrize("rnn", RNNS)
def test_greedy_texts_are_the_same(rnn):
    lm = model(RNNS[rnn])
    loop = lm.sample("abc", 60, temperature=0, num_samples=2, decoder="loop")
    assert lm.sample("abc", 60, temperature=0, num_samples=2, decoder="compiled") == loop
    assert lm.sample("abc", 60, top_k=1, seed=1, num_samples=2, decoder="compiled") == loop
    assert lm.sample("abc", 60, temperature=1e-30, seed=1, num_samples=2, decoder="compiled") == loop


def test_a_seed_reproduces_the_compiled_texts():
    lm = model()
    texts = lm.sample("a", 50, seed=5, num_samples=3, top_p=0.95, decoder="compiled")
    assert texts == lm.sample("a", 50, seed=5, num_samples=3, top_p=0.95, decoder="compiled")
    assert texts != lm.sample("a", 50, seed=6, num_samples=3, top_p=0.95, decoder="compiled")
    assert len(set(texts)) == 3 and all(len(t) == 51 for t in texts)


@pytest.mark.parametrize("backend, used", [("cpp", "compiled"), ("auto", "compiled"), ("reference", "loop")])
def test_auto_decodes_as_the_rnn_runs(backend, used):
    """The compiled loop where the rnn itself runs on the compiled CPU kernels."""
    lm = model(functools.partial(FusedLSTM, hidden_size=12, backend=backend))
    assert lm.sample("a", 40, seed=2) == lm.sample("a", 40, seed=2, decoder=used)
    assert lm.sample("a", 40, seed=2, decoder="compiled") != lm.sample("a", 40, seed=2, decoder="loop")


class OwnHead(CharLanguageModel):
    def head(self, features):
        return super().head(features) * 2


def with_extra_parameter():
    lm = model()
    lm.rnn.register_parameter("layernorm_ih_weight_l0", nn.Parameter(torch.ones(48)))
    return lm


@pytest.mark.parametrize("make, reason", [
    (lambda: model().double(), "the model's weights are torch.float64 on cpu, not float32 on the CPU"),
    (lambda: OwnHead(vocab=VOCAB, rnn=rnn_factory(), optimizer=adam(), val_sample_length=0),
     "OwnHead computes its predictions otherwise than CharLanguageModel"),
    (with_extra_parameter, r"the rnn has parameters beyond torch.nn's weights \(layernorm_ih_weight_l0\)"),
    (lambda: model(functools.partial(nn.RNN, hidden_size=12)), "the rnn is a RNN, not a FusedLSTM"),
])
def test_models_the_compiled_loop_cannot_run_are_named_and_sampled_by_the_loop(make, reason):
    lm = make()
    with pytest.raises(ValueError, match="decoder: the compiled loop cannot run this model: " + reason):
        lm.sample("a", 5, decoder="compiled")
    assert lm.sample("a", 30, seed=4, decoder="auto") == lm.sample("a", 30, seed=4, decoder="loop")


@pytest.mark.parametrize("decoder", ["compiled", "loop"])
def test_a_text_ends_before_its_stop_string(decoder):
    """What the draws give up to the stop string, whichever sample stops first (the others
    draw on)."""
    lm = model()
    full = lm.sample("ab", 120, seed=7, num_samples=4, decoder=decoder)
    stopped = lm.sample("ab", 120, seed=7, num_samples=4, stop="e ", decoder=decoder)
    for whole, text in zip(full, stopped):
        cut = whole.find("e ", 2)
        assert text == (whole if cut < 0 else whole[:cut])
    assert any(len(t) < 122 for t in stopped)


@pytest.mark.parametrize("decoder", ["compiled", "loop"])
def test_text_streams_in_pieces_that_make_the_texts(decoder):
    pieces = []
    texts = model().sample("ab", 150, seed=1, num_samples=2, stop="hh", decoder=decoder,
                           on_text=lambda index, text: pieces.append((index, text)))
    assert pieces[0] == (0, "ab") and pieces[1] == (1, "ab")  # the start text first
    counts = []
    for index, text in enumerate(texts):
        own = [piece for i, piece in pieces if i == index]
        assert "".join(own) == text and "hh" not in text
        counts.append(len(own))
    assert max(counts) > 3  # streamed as the chunks of steps come, not at the end


def test_packed_weights_are_reused_until_a_weight_changes():
    """The compiled loop's copy of the weights follows every change of them (an optimizer
    step, load_state_dict): greedy texts stay the loop decoder's."""
    lm = model(functools.partial(FusedLSTM, hidden_size=12, backend="cpp"))
    lm.sample("a", 5)
    packed = lm._packed_weights.get(lm._generation_parts())
    assert lm._packed_weights.get(lm._generation_parts()) is packed
    with torch.no_grad():
        lm.rnn.weight_hh_l0.mul_(3.0)
        lm.output_layer.module.bias.add_(torch.linspace(-2, 2, len(VOCAB)))
    assert lm.sample("ab", 40, temperature=0) == lm.sample("ab", 40, temperature=0, decoder="loop")
    assert lm._packed_weights.get(lm._generation_parts()) is not packed
    other = model(functools.partial(FusedLSTM, hidden_size=12, backend="cpp"), vocab=VOCAB)
    with torch.no_grad():
        for p in other.parameters():
            p.normal_()
    lm.load_state_dict(other.state_dict())
    assert lm.sample("ab", 40, temperature=0) == other.sample("ab", 40, temperature=0, decoder="loop")


def test_a_model_that_sampled_can_be_copied_and_pickled():
    lm = model(functools.partial(FusedLSTM, hidden_size=12, backend="cpp"))
    text = lm.sample("a", 30, seed=1)
    assert copy.deepcopy(lm).sample("a", 30, seed=1) == text
    assert pickle.loads(pickle.dumps(lm)).sample("a", 30, seed=1) == text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_a_model_on_a_gpu_samples_with_the_loop():
    lm = model(functools.partial(FusedLSTM, hidden_size=12)).cuda()
    with pytest.raises(ValueError, match="torch.float32 on cuda:0, not float32 on the CPU"):
        lm.sample("a", 5, decoder="compiled")
    assert lm.sample("a", 30, seed=4) == lm.sample("a", 30, seed=4, decoder="loop")
