"""Generating text from a language model: the decoders that draw tokens, and the texts they make.

A decoder starts from the logits (B, V) and the recurrent state after a prefix and, asked
for ``run(steps)``, draws that many tokens per sequence, each fed back before the next:

- :class:`LoopDecoder`: one step at a time through the model's own forward and
  :func:`~lightning_rnn.modules.sampling.sample_next` (any model, device and precision);
- :class:`~lightning_rnn.kernels.generate.CompiledDecoder`: whole chunks of steps in C++,
  for an embedding, a stack of unidirectional LSTM or GRU layers without options beyond
  torch.nn's (an LSTM's projection included) and a linear layer, float32 on the CPU
  (:func:`why_not_compiled` says why a model is not).

The two draw from the same distribution; their random draws differ, so the same seed
gives each its own text. :func:`decode_texts` runs a decoder in chunks of steps, ends
each text at a stop string and hands the text to a callback as it grows.
"""
from __future__ import annotations

import re
import weakref
from collections.abc import Callable

import torch
from torch import nn

from ..data.vocab import CharVocab
from ..kernels import dispatch
from ..kernels.backends import BackendUnavailable
from ..kernels.generate import CompiledDecoder, GenerationWeights
from ..layers import FusedGRU, FusedLSTM, FusedRNNBase
from .sampling import sample_next
from .state import State

DECODERS = ("auto", "compiled", "loop")
#: Steps of a decoder's first call; later calls double it up to LARGEST_CHUNK, so text
#: streams soon after the start and the calls' own cost is spread over many steps later.
FIRST_CHUNK, LARGEST_CHUNK = 16, 256

_CELLS = {FusedLSTM: "lstm", nn.LSTM: "lstm", FusedGRU: "gru", nn.GRU: "gru"}
_TORCH_WEIGHT = re.compile(r"(weight_ih|weight_hh|bias_ih|bias_hh|weight_hr)_l\d+")

TextCallback = Callable[[int, str], None]


class LoopDecoder:
    """Draws each token with ``sample_next`` and feeds it through ``model(ids, state)`` (the
    model's forward: ``(B, 1)`` ids -> ``((B, 1, V) logits, state)``)."""

    def __init__(self, model: nn.Module, logits: torch.Tensor, state: State, temperature: float,
                 top_k: int | None, top_p: float | None, generator: torch.Generator):
        self.model, self.logits, self.state = model, logits, state
        self.temperature, self.top_k, self.top_p, self.generator = temperature, top_k, top_p, generator

    def run(self, steps: int) -> torch.Tensor:
        """The next ``steps`` tokens of every sequence, (B, steps) int64."""
        ids = torch.empty(self.logits.shape[0], steps, dtype=torch.long, device=self.logits.device)
        for t in range(steps):
            ids[:, t] = sample_next(self.logits, self.temperature, self.top_k, self.generator, self.top_p)
            logits, self.state = self.model(ids[:, t : t + 1], self.state)
            self.logits = logits[:, -1]
        return ids


def why_not_compiled(embedding: nn.Module, rnn: nn.Module, linear: nn.Module) -> str | None:
    """Why the compiled loop cannot run ``embedding -> rnn -> linear``, or None if it can.

    What it runs: a ``torch.nn.Embedding`` (without max_norm, which rewrites its weights as
    it reads them), a unidirectional FusedLSTM, FusedGRU, torch.nn.LSTM or torch.nn.GRU
    whose parameters are torch.nn's weights alone (cell options with parameters of their
    own, such as layer norm, and parametrized weights run the loop) and without zoneout
    (in evaluation it mixes the states by their expectation), a ``torch.nn.Linear``; all
    float32 on the CPU.
    """
    if type(embedding) is not nn.Embedding or embedding.max_norm is not None:
        return f"the input layer is a {type(embedding).__name__}, not a torch.nn.Embedding without max_norm"
    if type(linear) is not nn.Linear:
        return f"the output layer is a {type(linear).__name__}, not a torch.nn.Linear"
    if type(rnn) not in _CELLS:
        return f"the rnn is a {type(rnn).__name__}, not a FusedLSTM, FusedGRU, torch.nn.LSTM or torch.nn.GRU"
    if rnn.bidirectional:
        return "the rnn is bidirectional"
    extra = [name for name, _ in rnn.named_parameters() if not _TORCH_WEIGHT.fullmatch(name)]
    if extra:
        return f"the rnn has parameters beyond torch.nn's weights ({', '.join(extra)})"
    zoneout = getattr(rnn, "zoneout", 0.0)
    if any(zoneout) if isinstance(zoneout, (tuple, list)) else zoneout:
        return "the rnn uses zoneout"
    for t in (embedding.weight, *rnn.parameters(), *linear.parameters()):
        if t.device.type != "cpu" or t.dtype != torch.float32:
            return f"the model's weights are {t.dtype} on {t.device}, not float32 on the CPU"
    return None


def runs_compiled_kernels(rnn: nn.Module) -> bool:
    """Whether ``rnn`` is a fused layer whose forward runs on the compiled CPU kernels."""
    if not isinstance(rnn, FusedRNNBase):
        return False
    return dispatch.resolve(rnn.backend, rnn.weight_ih_l0.device) == "cpp"


def compiled_weights(embedding: nn.Embedding, rnn: nn.Module, linear: nn.Linear,
                     dtype: torch.dtype = torch.float32) -> GenerationWeights:
    """The weights of a model :func:`why_not_compiled` accepts, packed for the compiled loop."""
    proj = getattr(rnn, "proj_size", 0)
    layers = []
    for k in range(rnn.num_layers):
        b_ih, b_hh = (getattr(rnn, f"bias_ih_l{k}"), getattr(rnn, f"bias_hh_l{k}")) if rnn.bias else (None, None)
        w_hr = getattr(rnn, f"weight_hr_l{k}") if proj else None
        layers.append((getattr(rnn, f"weight_ih_l{k}"), getattr(rnn, f"weight_hh_l{k}"), b_ih, b_hh, w_hr))
    return GenerationWeights.pack(_CELLS[type(rnn)], embedding.weight, layers, linear.weight, linear.bias, dtype)


class PackedWeightsCache:
    """The last packing of a model's weights for the compiled loop, reused while every
    parameter is the same tensor at the same version (an optimizer step, ``load_state_dict``
    or ``.to()`` makes it pack again): packing copies every weight, which for a large
    model costs as much as generating a few dozen characters."""

    def __init__(self):
        self._seen: list[tuple[weakref.ref, int]] = []
        self._weights: GenerationWeights | None = None

    def get(self, parts: tuple[nn.Module, ...]) -> GenerationWeights:
        tensors = [p for module in parts for p in module.parameters()]
        fresh = len(tensors) == len(self._seen) and all(
            ref() is t and version == t._version for (ref, version), t in zip(self._seen, tensors))
        if not fresh:
            self._weights = compiled_weights(*parts)
            self._seen = [(weakref.ref(t), t._version) for t in tensors]
        return self._weights

    def __getstate__(self):  # a copy of the model (pickled, deep-copied) packs afresh
        return {}

    def __setstate__(self, state):
        self.__init__()


def make_decoder(choice: str, model: nn.Module, parts: tuple | str, logits: torch.Tensor, state: State,
                 temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator,
                 cache: PackedWeightsCache | None = None):
    """The decoder ``choice`` asks for: ``"loop"``; ``"compiled"`` (a ValueError naming
    ``decoder`` and the reason where it cannot run); ``"auto"``: compiled where the model's
    rnn runs on the compiled CPU kernels itself and the compiled loop can run it, else the loop.

    ``parts``: the model's ``(embedding, rnn, linear)``, or why it has no such parts;
    ``cache``: where the packed weights are kept between calls (None: packed afresh).
    """
    if choice != "loop":
        reason = parts if isinstance(parts, str) else why_not_compiled(*parts)
        if reason is None and choice == "auto" and not runs_compiled_kernels(parts[1]):
            reason = "the rnn does not run on the compiled CPU kernels"
        if reason is None:
            try:
                weights = (cache or PackedWeightsCache()).get(parts)
                return CompiledDecoder(weights, logits, state, temperature, top_k, top_p, generator)
            except BackendUnavailable as err:
                reason = str(err)
        if choice == "compiled":
            raise ValueError(f"decoder: the compiled loop cannot run this model: {reason}")
    return LoopDecoder(model, logits, state, temperature, top_k, top_p, generator)


def repeat_rows(state: State | torch.Tensor, rows: int):
    """A state (tensor or tuple of (L, 1, ·)) or logits (1, V) with its one sequence
    repeated to ``rows`` (along dim 1 of a state, dim 0 of logits)."""
    if isinstance(state, tuple):
        return tuple(repeat_rows(s, rows) for s in state)
    if state.dim() == 2:
        return state.expand(rows, -1).contiguous()
    return state.expand(-1, rows, -1).contiguous()


class TextStream:
    """One sample's text as it grows: the start text, then generated characters up to the
    first occurrence of ``stop`` in them (left out). ``on_text(index, text)`` receives the
    text in pieces, which joined are the final text; the last ``len(stop) - 1`` characters
    wait until they cannot begin the stop string."""

    def __init__(self, index: int, start: str, stop: str | None, on_text: TextCallback | None):
        self.index, self.start, self.stop, self.on_text = index, start, stop, on_text
        self.generated, self.sent, self.done = "", 0, False
        if on_text is not None and start:
            on_text(index, start)

    def extend(self, chars: str) -> None:
        if self.done:
            return
        searched = max(0, len(self.generated) - len(self.stop) + 1) if self.stop else 0
        self.generated += chars
        if self.stop:
            found = self.generated.find(self.stop, searched)
            if found >= 0:
                self.generated, self.done = self.generated[:found], True
        self._send(len(self.generated) if self.done or not self.stop else len(self.generated) - len(self.stop) + 1)

    def finish(self) -> str:
        """The whole text, its last piece sent."""
        self.done = True
        self._send(len(self.generated))
        return self.start + self.generated

    def _send(self, end: int) -> None:
        if end > self.sent and self.on_text is not None:
            self.on_text(self.index, self.generated[self.sent : end])
        self.sent = max(self.sent, end)


def decode_texts(decoder, vocab: CharVocab, starts: list[str], length: int, stop: str | None = None,
                 on_text: TextCallback | None = None) -> list[str]:
    """``starts[b]`` followed by up to ``length`` characters ``decoder`` draws for sequence b,
    ending before the first ``stop`` in them; drawing ends early once every text has stopped."""
    streams = [TextStream(b, start, stop, on_text) for b, start in enumerate(starts)]
    left, chunk = length, FIRST_CHUNK
    while left > 0 and not all(s.done for s in streams):
        steps = min(chunk, left)
        ids = decoder.run(steps).cpu()
        for stream, row in zip(streams, ids):
            stream.extend(vocab.decode(row))
        left, chunk = left - steps, min(2 * chunk, LARGEST_CHUNK)
    return [s.finish() for s in streams]
