"""The cpp backend's layout copies: the blocked transpose of the weight gradients and the
panels of the per-step GEMM, exact against torch's own copies."""
import pytest
import torch

from lightning_rnn.kernels import cpp


@pytest.fixture(scope="module")
def ext():
    return cpp.load()


@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (32, 32), (40, 24), (549, 200), (549, 203), (19, 37), (2500, 64), (64, 1024)])
def test_transposed_equals_the_strided_copy(ext, shape):
    """8 x 8 register blocks in 32 x 32 tiles with ragged edges on either side."""
    a = torch.randn(*shape)
    got = ext.transposed(a)
    assert got.is_contiguous() and torch.equal(got, a.t())


def test_transposed_of_a_row_strided_view_and_other_dtypes(ext):
    base = torch.randn(70, 50)
    view = base[3:60, 5:45]  # row stride 50, unit column stride: the blocked path
    assert torch.equal(ext.transposed(view), view.t())
    for a in (base.t(), base.double(), base.to(torch.bfloat16)):  # not blockable: ATen's copy
        got = ext.transposed(a)
        assert got.dtype == a.dtype and got.is_contiguous() and torch.equal(got, a.t())


def _panels(m, width):
    """(K, N) -> (ceil(N / width), K, width), zero-padded: what the step GEMM reads."""
    K, N = m.shape
    P = -(-N // width)
    padded = torch.zeros(K, P * width)
    padded[:, :N] = m
    return padded.view(K, P, width).permute(1, 0, 2)


@pytest.mark.parametrize("K, N", [(1, 1), (20, 80), (20, 60), (37, 20), (512, 2048), (2048, 512), (3, 100)])
@pytest.mark.parametrize("layout", ["contiguous", "transposed_view", "row_strided"])
def test_panels_equal_the_padded_permuted_copy(ext, K, N, layout):
    """Row copies where M's columns are contiguous (the backward's W_hh), column walks for
    a transposed view (the forward's W_hh^T), and a zero-padded last panel; panels are
    two vectors wide (16 columns with AVX2, 32 with AVX-512)."""
    if layout == "contiguous":
        m = torch.randn(K, N)
    elif layout == "transposed_view":
        m = torch.randn(N, K).t()
    else:
        m = torch.randn(K, N + 5)[:, 2:N + 2]
    got, width = ext.panels(m), ext.panel_width()
    assert width in (16, 32)
    assert got.shape == (-(-N // width), K, width) and got.is_contiguous() and torch.equal(got, _panels(m, width))


def test_panels_reject_a_non_float32_matrix(ext):
    with pytest.raises(RuntimeError, match="float32 matrix"):
        ext.panels(torch.randn(4, 4).double())


@pytest.mark.parametrize("n", [*range(1, 71), 2500])
def test_panel_tiles_cover_the_rows_with_at_most_one_narrow_tile(ext, n):
    """Tiles of fewer than 5 rows run ~1.5x longer per row (csrc/rnn_panels.h): a split
    uses at most one of them, and none where tiles of 5 and 6 add up to n (n >= 20)."""
    tiles = ext.panel_tiles(n)
    assert sum(tiles) == n and all(1 <= t <= 6 for t in tiles)
    narrow = [t for t in tiles if t < 5]
    assert len(narrow) <= 1 and not (n >= 20 and narrow)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 9, 13, 19, 32, 50, 64, 257])
@pytest.mark.parametrize("K, N", [(20, 37), (64, 256), (512, 48), (8, 100), (600, 37)])
def test_panel_gemm_matches_a_float64_matmul(ext, n, K, N):
    """Every tile height the split uses, a partial last panel (N 37, 48 and 100 with
    panels of 32 columns), a row-strided a, depths of one and of several blocks of k
    (512; 600: a last, partial block)."""
    base = torch.randn(n, K + 3)
    a = base[:, 2 : K + 2]
    m = torch.randn(K, N)
    got = ext.panel_gemm(a, ext.panels(m), N)
    torch.testing.assert_close(got.double(), a.double() @ m.double(), rtol=1e-5, atol=1e-4 * K**0.5)


@pytest.mark.parametrize("n", [1, 6])
@pytest.mark.parametrize("K", [1024, 4096])
def test_panel_gemm_sums_long_depths_in_blocks(ext, n, K):
    """K terms of 0.1 summed in one running float32 sum are off by 9.7e-6 (K 1024) and
    3.9e-5 (K 4096) relative; in blocks of 256 k (as at::mm blocks them) by 2.4e-6 and
    2.5e-6: the panel GEMM rounds off no more than at::mm at the depths the backward's
    per-step dG_h W_hh (K = 4H) reaches."""
    a, m = torch.full((n, K), 0.1), torch.ones(K, 40)  # N 40: a whole panel and a partial one
    got = ext.panel_gemm(a, ext.panels(m), 40).double()
    exact = a.double() @ m.double()
    assert float((got - exact).abs().max() / exact.abs().max()) < 5e-6


def test_panel_gemm_rejects_mismatched_or_non_float32_operands(ext):
    panels = ext.panels(torch.randn(4, 6))
    with pytest.raises(RuntimeError, match=r"panel_gemm: expected panels\(m\) of a float32 \(5, 6\) matrix"):
        ext.panel_gemm(torch.randn(3, 5), panels, 6)
    with pytest.raises(RuntimeError, match=r"panel_gemm: expected panels\(m\) of a float32 \(4, 40\) matrix"):
        ext.panel_gemm(torch.randn(3, 4), panels, 40)
    with pytest.raises(RuntimeError, match="panel_gemm: expected a float32 CPU matrix a"):
        ext.panel_gemm(torch.randn(3, 4).double(), panels, 6)
    with pytest.raises(RuntimeError, match="panel_gemm: expected a float32 CPU matrix a"):
        ext.panel_gemm(torch.randn(4, 3).t(), panels, 6)
