"""The compiled CPU kernels from several Python threads: a kernel call releases the GIL, as
torch's own ops do, and threads running the kernels at once (sharing the buffer pool)
get exactly the numbers of the same work run one thread after another."""
import threading
import time

import torch
from torch.nn.utils.rnn import pack_padded_sequence

from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.kernels import cpp


def test_a_kernel_call_lets_other_python_threads_run():
    """While one thread is inside a long kernel call, a Python thread keeps running: its
    longest pause is a small part of the call (holding the GIL, it would pause for all of it)."""
    ext = cpp.load()
    T, B, I, H = 3000, 8, 64, 256
    torch.manual_seed(0)
    args = (torch.randn(T * B, I), torch.full((T,), B), torch.zeros(B, H), torch.zeros(B, H),
            torch.randn(4 * H, I) / 16, torch.randn(4 * H, H) / 16, None, None, None, False,
            torch.float32, torch.float32)
    stop, running = threading.Event(), threading.Event()
    longest = [0.0]

    def tick():
        last = time.perf_counter()
        running.set()
        while not stop.is_set():
            now = time.perf_counter()
            longest[0], last = max(longest[0], now - last), now

    ticker = threading.Thread(target=tick)
    ticker.start()
    running.wait()
    longest[0] = 0.0
    start = time.perf_counter()
    ext.lstm_forward(*args)
    call = time.perf_counter() - start
    stop.set()
    ticker.join()
    assert longest[0] < call / 2, (longest[0], call)


# (layer class, dtype, input, hidden, layers, bidirectional, checkpoint chunk, packed, T, B)
CASES = [
    (FusedLSTM, torch.float32, 24, 128, 2, False, None, False, 30, 24),
    (FusedGRU, torch.float32, 32, 192, 1, False, 3, True, 25, 16),
    (FusedLSTM, torch.float64, 16, 48, 1, True, 3, True, 20, 12),
    (FusedGRU, torch.float64, 20, 64, 2, False, None, False, 15, 20),
]


def _layer(case, seed: int):
    """The case's layer, its weights drawn from ``seed`` (torch's global generator: so made
    before the threads start)."""
    cls, dtype, I, H, L, bidirectional, chunk, _, _, _ = case
    torch.manual_seed(seed)
    return cls(I, H, num_layers=L, bidirectional=bidirectional, checkpoint_chunk_size=chunk, dtype=dtype,
               backend="cpp")


def _train(case, layer, seed: int, steps: int) -> list[torch.Tensor]:
    """Outputs, final states and every gradient of `steps` forward + backward passes."""
    cls, dtype, I, H, L, bidirectional, chunk, packed, T, B = case
    generator = torch.Generator().manual_seed(seed)
    results = []
    for _ in range(steps):
        x = torch.randn(T, B, I, dtype=dtype, generator=generator).requires_grad_()
        lengths = torch.randint(1, T + 1, (B,), generator=generator)
        inputs = pack_padded_sequence(x, lengths, enforce_sorted=False) if packed else x
        out, state = layer(inputs)
        out = out.data if packed else out
        states = list(state) if isinstance(state, tuple) else [state]
        loss = (out * out.detach().cos()).sum() + sum(s.sum() for s in states)
        layer.zero_grad(set_to_none=True)
        loss.backward()
        results += [out.detach(), *(s.detach() for s in states), x.grad, *(p.grad for p in layer.parameters())]
    return results


def test_threads_running_the_kernels_at_once_match_running_them_in_turn():
    """Four threads train their own layers (float32 and float64, LSTM and GRU, checkpointed,
    packed, bidirectional) at the same time; every output and gradient is bitwise the one
    the same work gives run sequentially."""
    cpp.load()
    steps = 3
    expected = [_train(case, _layer(case, seed), seed, steps) for seed, case in enumerate(CASES)]
    layers = [_layer(case, seed) for seed, case in enumerate(CASES)]
    got: list = [None] * len(CASES)
    errors: list = []
    barrier = threading.Barrier(len(CASES))

    def work(k: int) -> None:
        try:
            barrier.wait()
            got[k] = _train(CASES[k], layers[k], k, steps)
        except BaseException as err:  # reported below, with the case
            errors.append((CASES[k][0].__name__, err))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(CASES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for k, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert len(want) == len(have)
        for i, (a, b) in enumerate(zip(want, have, strict=True)):
            assert torch.equal(a, b), (CASES[k][0].__name__, CASES[k][1], i)


def test_threads_entering_one_weight_pack_store_each_get_their_own_outer_store_back():
    """A weight-pack store is active per thread; one thread's exit must not hand it another
    thread's outer store (which would then fail its own exit)."""
    ext = cpp.load()
    outer, shared = ext.WeightPacks(), ext.WeightPacks()
    a_entered, b_entered = threading.Event(), threading.Event()
    errors: list = []

    def thread_a():
        try:
            with outer:
                with shared:
                    a_entered.set()
                    b_entered.wait()
                # back in `outer` on this thread: its exit must match
        except BaseException as err:
            errors.append(err)

    def thread_b():
        a_entered.wait()
        shared.__enter__()  # no outer store on this thread
        b_entered.set()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
