"""Poisson sampling: the paper's Appendix B gate and the seeding rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpgrpo.errors import PrivacyBudgetError
from dpgrpo.privacy.sampling import PoissonSampler


def _inclusion_matrix(sampler: PoissonSampler, trials: int) -> np.ndarray:
    x = np.zeros((trials, sampler.n))
    for t in range(trials):
        x[t, sampler.sample()] = 1.0
    return x


def test_appendix_b_gate_os_entropy():
    """6 slots, q = 0.2, 20,000 trials: frequency error < 0.012, correlation < 0.035."""
    sampler = PoissonSampler(6, 0.2)
    assert sampler.releasable and sampler.secure
    x = _inclusion_matrix(sampler, 20_000)
    assert np.abs(x.mean(axis=0) - 0.2).max() < 0.012
    corr = np.corrcoef(x, rowvar=False)
    assert np.abs(corr[~np.eye(6, dtype=bool)]).max() < 0.035
    # Empty rounds happen (probability 0.8^6 = 0.26) and are returned, not skipped.
    assert 0.2 < (x.sum(axis=1) == 0).mean() < 0.32


def test_seeded_sampler_is_reproducible_and_not_releasable():
    a, b = PoissonSampler(50, 0.3, seed=7), PoissonSampler(50, 0.3, seed=7)
    assert not a.releasable
    draws = [a.sample() for _ in range(5)]
    assert all(np.array_equal(d, b.sample()) for d in draws)
    state = a.state_dict()
    nxt = a.sample()
    c = PoissonSampler(50, 0.3, seed=7)
    c.load_state_dict(state)
    assert np.array_equal(c.sample(), nxt)


def test_os_entropy_state_has_no_secret():
    s = PoissonSampler(10, 0.5)
    assert s.state_dict() == {"source": "os-entropy"}
    with pytest.raises(PrivacyBudgetError):
        s.load_state_dict(PoissonSampler(10, 0.5, seed=1).state_dict())


def test_expected_batch_and_validation():
    assert PoissonSampler(6988, 128 / 6988).expected_batch == pytest.approx(128)
    assert len(PoissonSampler(100, 0.0).sample()) == 0
    assert len(PoissonSampler(100, 1.0).sample()) == 100
    with pytest.raises(PrivacyBudgetError):
        PoissonSampler(0, 0.1)
    with pytest.raises(PrivacyBudgetError):
        PoissonSampler(10, 1.1)


def test_os_entropy_coins_are_read_every_round_and_decide_the_batch(monkeypatch):
    reads: list[int] = []
    patterns = iter([b"\x00", b"\xff", b"\x00"])

    def fake(nbytes: int) -> bytes:  # all-zero words: u = 0 < q; all-one words: u ~ 1 > q
        reads.append(nbytes)
        return next(patterns) * nbytes

    monkeypatch.setattr("dpgrpo.privacy.sampling.read_entropy", fake)
    sampler = PoissonSampler(16, 0.3)
    assert sampler.sample().tolist() == list(range(16))
    assert sampler.sample().tolist() == []
    assert sampler.sample().tolist() == list(range(16))
    assert reads == [8 * 16] * 3  # 64 fresh bits per slot, every round


def test_two_os_entropy_samplers_disagree():
    a, b = PoissonSampler(4096, 0.5), PoissonSampler(4096, 0.5)
    assert not np.array_equal(a.sample(), b.sample())  # equal with probability 2^-4096


def test_public_n_never_counts_valid_records():
    from dpgrpo.errors import ConfigError
    from dpgrpo.privacy.sampling import public_slot_count

    def count(**kw):
        args = dict(n_slots=None, limit=None, problems=90, source_rows=100, canaries=4,
                    embedded=False)
        return public_slot_count(**{**args, **kw})

    assert (count(n_slots=500).n, count(n_slots=500).source) == (500, "data.n_slots")
    assert (count(limit=120).n, count(limit=120).source) == (124, "data.limit")
    assert (count().n, count().source) == (104, "source rows")  # 10 invalid rows: absent slots
    assert count(embedded=True, problems=100).source == "embedded task"
    # n does not move when more records turn out to be invalid.
    assert count(limit=120, problems=80).n == count(limit=120, problems=120).n == 124
    with pytest.raises(ConfigError, match=r"data.n_slots"):
        count(n_slots=50)


# --- issue 32, mutation (b): the coins' resolution -------------------------------------------

def _word(u_index: int) -> bytes:
    """One 64-bit coin whose 53-bit uniform is u_index / 2^53 (its low 11 bits all set)."""
    return int((u_index << 11) | 0x7FF).to_bytes(8, "little")


@pytest.mark.parametrize("q", [128 / 6988, 0.2, 1e-6, 2.0 ** -40 * 3])
def test_coins_have_53_bit_resolution(q):
    """A slot whose coin is one 53-bit step below q is sampled, one step above (or at q) is
    not: the inclusion probability is q to 2^-53. Coins of 8 bits (0.01953 instead of the
    MATH preset's 0.01832) put both on the same side; so would any resolution under 53 bits.
    Deterministic: the words are chosen, not drawn."""
    edge = q * 2.0 ** 53                                 # exact: a power-of-two scaling
    below, above = math.ceil(edge) - 1, math.floor(edge) + 1
    at = [math.ceil(edge)] if math.ceil(edge) == edge else []
    words = b"".join(_word(u) for u in [below, above, *at])
    n = 2 + len(at)
    assert PoissonSampler(n, q, entropy=lambda k: words[:k]).sample().tolist() == [0]
    from dpgrpo.verify.randomness import coin_resolution_bits

    assert coin_resolution_bits(q) == 53


def test_inclusion_frequency_at_small_q_within_a_binomial_interval():
    """2^20 slots at q = 128/6,988 (the MATH preset), the coins a fixed ChaCha20 stream (so
    the verdict is deterministic): the count lies within 6 standard deviations of n q
    (sd 137); 8-bit coins (real q 0.01953) land 9.3 sd away."""
    from dpgrpo.privacy.record_coins import keystream
    from dpgrpo.verify.randomness import small_q_frequency_z

    n, q = 1 << 20, 128 / 6988
    key = bytes(range(50, 82))
    count = PoissonSampler(n, q, entropy=lambda k: keystream(key, bytes(16), k)).sample().size
    assert abs(count - n * q) <= 6 * math.sqrt(n * q * (1 - q))
    assert small_q_frequency_z() <= 6


def test_fixed_size_sampler_draws_exactly_qn_distinct_slots_uniformly():
    """train.batch_sampling = "fixed" (non-private arm, TRL's batch): 8 of 40 slots every
    round, each slot in 8/40 of 5,000 rounds within a binomial interval (sd 0.0057)."""
    from dpgrpo.privacy.sampling import SAMPLERS, FixedSizeSampler

    sampler = SAMPLERS["fixed"](40, 0.2)
    assert isinstance(sampler, FixedSizeSampler) and sampler.batch_size == 8
    x = np.zeros((5_000, 40))
    for t in range(5_000):
        drawn = sampler.sample()
        assert len(drawn) == 8 and len(set(drawn.tolist())) == 8
        assert list(drawn) == sorted(drawn)
        x[t, drawn] = 1.0
    assert np.abs(x.mean(axis=0) - 0.2).max() < 5 * math.sqrt(0.2 * 0.8 / 5_000)
    assert not (FixedSizeSampler(40, 0.2).sample() == FixedSizeSampler(40, 0.2).sample()).all()


def test_a_fixed_size_batch_is_refused_under_a_private_arm():
    """The certificate's bound is for Poisson sampling: "fixed" is for the non-private arm."""
    from dpgrpo.config import RunConfig, TrainConfig

    cfg = RunConfig(train=TrainConfig(arm="non-private", batch_sampling="fixed"))
    assert cfg.train.batch_sampling == "fixed"
    for arm in ("dp-grpo", "zero-advantage"):
        with pytest.raises(PrivacyBudgetError, match="Poisson"):
            RunConfig(train=TrainConfig(arm=arm, batch_sampling="fixed"))
