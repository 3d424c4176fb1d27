"""The clip-and-noise mechanism: sensitivity, identities, noise scale, empty batches."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from dpgrpo.errors import PrivacyError
from dpgrpo.privacy.mechanism import (
    clip_and_sum,
    clip_per_record,
    per_record_norms,
    privatize,
    sanitize_nonfinite,
)
from dpgrpo.privacy.noise import NoiseSource

SHAPES = {"layer1.weight": (4, 3), "layer1.bias": (4,), "layer2.weight": (2, 4)}


def _records(b: int, *, seed: int = 0, scale: float = 1.0, dtype=torch.float64) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: scale * torch.randn((b, *s), generator=g, dtype=dtype) for k, s in SHAPES.items()}


def _cat(a: dict, b: dict) -> dict:
    return {k: torch.cat([a[k], b[k]]) for k in a}


def _norm(d: dict) -> float:
    return math.sqrt(sum(float(v.pow(2).sum()) for v in d.values()))


def test_global_sensitivity_appendix_b():
    """20 random additions and one adversarial one (1e12): ||f(D') - f(D)|| / C <= 1 + 1e-10."""
    clip = 0.7
    base = _records(5)
    f_d = clip_and_sum(base, clip)
    additions = [_records(1, seed=100 + i, scale=10.0 ** (i % 5 - 2)) for i in range(20)]
    additions.append(_records(1, seed=999, scale=1e12))
    ratios = []
    for extra in additions:
        f_d2 = clip_and_sum(_cat(base, extra), clip)
        ratios.append(_norm({k: f_d2[k] - f_d[k] for k in f_d}) / clip)
    assert max(ratios) <= 1 + 1e-10
    assert max(ratios) > 0.999  # the adversarial record is clipped to C, not below


@pytest.mark.parametrize("excess", [1e-9, 1e-6, 1e-3, 0.05, 0.5, 0.99, 3.0])
def test_records_just_above_c_are_clipped_to_c(excess):
    """Norms C (1 + excess): each is clipped to C, and adding one moves the sum by at most C."""
    clip = 0.7
    base = _records(4, seed=1, scale=1e-2)  # norms ~0.05, well inside C
    extra = _records(3, seed=2)
    norms = per_record_norms(extra)
    extra = {k: v * (clip * (1 + excess) / norms).view(-1, *[1] * (v.dim() - 1))
             for k, v in extra.items()}
    assert torch.allclose(per_record_norms(extra), torch.full((3,), clip * (1 + excess),
                                                              dtype=torch.float64), rtol=1e-14)
    after = per_record_norms(clip_per_record(extra, clip))
    assert float((after - clip).abs().max()) <= 1e-12 * clip
    f_d = clip_and_sum(base, clip)
    for i in range(3):
        one = {k: v[i:i + 1] for k, v in extra.items()}
        f_d2 = clip_and_sum(_cat(base, one), clip)
        assert _norm({k: f_d2[k] - f_d[k] for k in f_d}) <= clip * (1 + 1e-12)


def test_clipping_is_joint_over_tensors():
    recs = _records(6, scale=3.0)
    clipped = clip_per_record(recs, 1.0)
    norms_before, norms_after = per_record_norms(recs), per_record_norms(clipped)
    for before, after in zip(norms_before, norms_after):
        assert float(after) == pytest.approx(min(1.0, float(before)), rel=1e-12)
    small = _records(2, scale=1e-3)
    assert all(torch.equal(small[k], clip_per_record(small, 1.0)[k]) for k in small)


def test_no_clip_no_noise_is_plain_sum():
    recs = _records(7)
    out = privatize(recs, clip_norm=math.inf, noise_multiplier=0.0, expected_batch=1.0,
                    noise=NoiseSource(seed=0))
    for k in recs:
        assert torch.equal(out.update[k], recs[k].sum(dim=0))


def test_divides_by_public_expected_batch_not_realized_size():
    recs = _records(3, scale=1e-3)
    out = privatize(recs, clip_norm=10.0, noise_multiplier=0.0, expected_batch=12.5,
                    noise=NoiseSource(seed=0))
    assert out.num_records == 3
    for k in recs:
        assert torch.allclose(out.update[k], recs[k].sum(dim=0) / 12.5, rtol=0, atol=1e-15)


def test_noise_added_exactly_once_with_std_sigma_c():
    recs = _records(4)
    sigma, clip, m = 1.3, 0.5, 8.0
    out = privatize(recs, clip_norm=clip, noise_multiplier=sigma, expected_batch=m,
                    noise=NoiseSource(seed=123))
    replay = NoiseSource(seed=123)
    replay.start_round()
    summed = clip_and_sum(recs, clip)
    flat = replay.normal((sum(v.numel() for v in summed.values()),), sigma * clip)
    parts = flat.split([v.numel() for v in summed.values()])
    for k, z in zip(summed, parts):  # one fp64 draw for the round, split in tensor order
        assert summed[k].dtype == z.dtype == out.update[k].dtype == torch.float64
        assert torch.equal(out.update[k], (summed[k] + z.view(summed[k].shape)) / m)


def test_empirical_noise_std_matches_sigma_c():
    """Chi-square test of the variance at a fixed false-alarm rate of 1e-6."""
    sigma, clip, n = 0.8, 0.05, 200_000
    noise = NoiseSource()  # secure mode, OS entropy
    empty = {"w": torch.zeros((0, n), dtype=torch.float64)}
    out = privatize(empty, clip_norm=clip, noise_multiplier=sigma, expected_batch=1.0, noise=noise)
    z = out.update["w"]
    stat = float((z.pow(2).sum()) / (sigma * clip) ** 2)  # ~ chi2(n) under H0 (known mean 0)
    p = 2 * min(stats.chi2.cdf(stat, n), stats.chi2.sf(stat, n))
    assert p > 1e-6
    assert float(z.std()) == pytest.approx(sigma * clip, rel=0.01)


def test_empty_batch_is_noise_only():
    empty = {k: torch.zeros((0, *s), dtype=torch.float32) for k, s in SHAPES.items()}
    out = privatize(empty, clip_norm=0.1, noise_multiplier=2.0, expected_batch=4.0,
                    noise=NoiseSource(seed=5))
    assert out.num_records == 0
    replay = NoiseSource(seed=5)
    replay.start_round()
    sizes = [math.prod(s) for s in SHAPES.values()]
    parts = replay.normal((sum(sizes),), 0.2).split(sizes)
    for (k, s), z in zip(SHAPES.items(), parts):  # fp32 gradients: noise and update stay fp64
        assert out.update[k].shape == s and out.update[k].dtype == torch.float64
        assert torch.equal(out.update[k], z.view(s) / 4.0)
        assert float(out.update[k].abs().sum()) > 0


def test_nonfinite_record_is_zeroed_by_fixed_rule():
    recs = _records(3)
    recs["layer2.weight"][1, 0, 0] = float("nan")
    recs["layer1.bias"][2, 1] = float("inf")
    clean, bad = sanitize_nonfinite(recs)
    assert bad.tolist() == [False, True, True]
    assert all(float(clean[k][1:].abs().sum()) == 0 for k in clean)
    assert all(torch.equal(clean[k][0], recs[k][0]) for k in clean)
    out = privatize(recs, clip_norm=1e6, noise_multiplier=0.0, expected_batch=1.0,
                    noise=NoiseSource(seed=0))
    assert out.finite and out.num_nonfinite == 2


def test_a_nonfinite_record_is_zeroed_in_place_never_dropped():
    """Invariant 3's fixed rule replaces a non-finite record by zeros where it is: the record
    axis keeps its B = 3, rows 1 (a NaN in layer2.weight) and 2 (an inf in layer1.bias) are 0.0
    in every tensor, row 0 is unchanged bit for bit, and its norms are (||row 0||, 0, 0)."""
    recs = {k: torch.arange(3 * math.prod(s), dtype=torch.float64).reshape(3, *s) / 8 + 1
            for k, s in SHAPES.items()}  # every entry >= 1: no row is zero before the rule
    recs["layer2.weight"][1, 0, 0] = float("nan")
    recs["layer1.bias"][2, 1] = float("inf")
    clean, bad = sanitize_nonfinite(recs)
    assert bad.tolist() == [False, True, True]
    for k, s in SHAPES.items():
        assert clean[k].shape == (3, *s), k
        assert torch.equal(clean[k][0], recs[k][0]), k
        assert torch.equal(clean[k][1:], torch.zeros((2, *s), dtype=torch.float64)), k
    row0 = math.sqrt(sum(float(recs[k][0].pow(2).sum()) for k in SHAPES))
    norms = per_record_norms(clean)
    assert norms.shape == (3,) and float(norms[0]) == pytest.approx(row0, rel=1e-15)
    assert norms[1:].tolist() == [0.0, 0.0]


def test_tensors_with_different_record_axes_are_refused():
    """Every tensor of the mapping carries the same B records. Without the check, a tensor
    with B = 1 beside one with B = 8 is broadcast over the 8 records: its one record enters the
    sum 8 times (each record's norm sqrt(2 * 0.25^2 + 2 * 0.5^2) = 0.79 < C, so 'b' sums to
    8 * 0.5 = 4.0 per coordinate, not 0.5), and no record's clipping bounds it. It is refused."""
    grads = {"a": torch.full((8, 2), 0.25, dtype=torch.float64),
             "b": torch.full((1, 2), 0.5, dtype=torch.float64)}
    with pytest.raises(PrivacyError, match="same leading record axis"):
        privatize(grads, clip_norm=1.0, noise_multiplier=0.0, expected_batch=8.0,
                  noise=NoiseSource(seed=0))
    with pytest.raises(PrivacyError, match="same leading record axis"):
        clip_and_sum(grads, 1.0)
    with pytest.raises(PrivacyError, match="same leading record axis"):
        clip_and_sum({"b": grads["b"], "a": grads["a"]}, 1.0)


def test_infinite_clip_with_noise_is_a_privacy_error():
    with pytest.raises(PrivacyError):
        privatize(_records(2), clip_norm=math.inf, noise_multiplier=1.0, expected_batch=1.0,
                  noise=NoiseSource(seed=0))
    with pytest.raises(PrivacyError):
        privatize(_records(2), clip_norm=1.0, noise_multiplier=1.0, expected_batch=0.0,
                  noise=NoiseSource(seed=0))


def test_fp16_records_clip_in_fp32_sum_in_fp64_and_a_bare_tensor_is_refused():
    g = {"w": torch.randn(5, 10, dtype=torch.float16)}   # the one type: name -> (B, ...)
    assert clip_per_record(g, 1.0)["w"].dtype == torch.float32
    out = clip_and_sum(g, 1.0)["w"]
    assert out.dtype == torch.float64 and out.shape == (10,)
    with pytest.raises(TypeError, match="pass a single tensor g as"):
        clip_and_sum(g["w"], 1.0)


def test_privatize_is_clip_sum_count_then_noise_and_scale():
    from dpgrpo.privacy.mechanism import clip_sum_count, noise_and_scale

    g = torch.Generator().manual_seed(5)
    grads = {"w": torch.randn(4, 6, generator=g, dtype=torch.float64) * 3}
    grads["w"][2] = float("nan")
    part = clip_sum_count(grads, 1.0)
    assert (part.num_records, part.num_nonfinite, part.num_clipped) == (4, 1, 3)
    rows = torch.nan_to_num(grads["w"], nan=0.0)
    rows = rows * torch.clamp(1.0 / rows.norm(dim=1, keepdim=True), max=1.0).nan_to_num(1.0)
    assert torch.allclose(part.total["w"], rows.sum(0), atol=1e-12)
    split = noise_and_scale(part.total, clip_norm=1.0, noise_multiplier=0.7, expected_batch=3.0,
                            noise=NoiseSource(seed=11))
    whole = privatize(grads, clip_norm=1.0, noise_multiplier=0.7, expected_batch=3.0,
                      noise=NoiseSource(seed=11))
    assert torch.equal(split["w"], whole.update["w"])
    assert whole.num_nonfinite == 1 and whole.num_clipped == 3


@pytest.mark.cuda
def test_noise_drawn_on_the_cpu_reaches_cuda_sums_bit_for_bit():
    """CUDA sums get the CPU's fp64 noise moved once, each tensor its own slice in order: the
    noisy, scaled update equals the CPU run's bit for bit (the transfer is exact and fp64
    addition and division are correctly rounded on both), stays on the sums' device, and its
    deviation from the sum is the seeded stream's draws."""
    from dpgrpo.privacy.mechanism import noise_and_scale

    total = {k: v.sum(0) for k, v in _records(3, seed=4).items()}
    on_cuda = {k: v.to("cuda") for k, v in total.items()}
    kw = dict(clip_norm=0.5, noise_multiplier=1.3, expected_batch=4.0)
    cpu = noise_and_scale(total, noise=NoiseSource(seed=9), **kw)
    gpu = noise_and_scale(on_cuda, noise=NoiseSource(seed=9), **kw)
    for name in total:
        assert gpu[name].device.type == "cuda" and gpu[name].dtype == torch.float64
        assert torch.equal(gpu[name].cpu(), cpu[name]), name
    source = NoiseSource(seed=9)
    source.start_round()
    flat = source.normal((sum(v.numel() for v in total.values()),), 0.5 * 1.3)
    moved = torch.cat([(gpu[k].cpu() * 4.0 - total[k]).reshape(-1) for k in total])
    torch.testing.assert_close(moved, flat, rtol=0, atol=1e-12)
