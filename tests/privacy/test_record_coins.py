"""Each record's randomness is bound to (round, slot) with 256 secret bits (issue 32, defect 1).

Each test here fails under a named mutation (docs/privacy-tests.md, "Randomness"): seeds handed
out in order, a stream keyed by fewer bits than read, a public constant in secure mode.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from dpgrpo.errors import PrivacyError
from dpgrpo.privacy import record_coins
from dpgrpo.privacy.contributors import Contributor, ProblemChooser, round_prompts
from dpgrpo.privacy.record_coins import (
    KEY_BYTES,
    PURPOSES,
    PromptCoins,
    RecordRandomness,
    RoundKey,
    torch_seed,
)
from dpgrpo.rollout.sampling import row_coins

KEY = RoundKey(bytes(range(32)), 3)


def _by_owner(coins: PromptCoins, purpose: str) -> dict[tuple[int, int], int]:
    return dict(zip(coins.owners, coins.seeds(purpose)))


def test_a_records_coins_ignore_its_batch_mates_and_position():
    """Slot 5's seeds (every purpose) and shuffle coins are the same alone, first, last, or
    among other records, and in a contributor's record its k prompts keep theirs."""
    alone = PromptCoins.for_records(KEY, [5], [0, 1])
    crowd = PromptCoins.for_records(KEY, [7, 2, 5, 9], [0, 1, 2, 3, 4])
    people = PromptCoins.for_records(KEY, [1, 5], [0, 3, 5])   # slot 5 brings two prompts
    for purpose in PURPOSES:
        assert _by_owner(alone, purpose)[(5, 0)] == _by_owner(crowd, purpose)[(5, 0)]
        assert _by_owner(people, purpose)[(5, 0)] == _by_owner(alone, purpose)[(5, 0)]
    assert torch.equal(alone.uniforms("shuffle", 8)[0], crowd.uniforms("shuffle", 8)[2])
    assert people.owners == ((1, 0), (1, 1), (1, 2), (5, 0), (5, 1))
    # rollout coins themselves: prompt 5's table from its seed alone
    seeds = crowd.seeds("rollout")
    table = row_coins(seeds, 4, 6)
    assert torch.equal(table[8:12], row_coins(alone.seeds("rollout"), 4, 6))


def test_streams_differ_by_slot_part_purpose_and_round():
    seeds = {KEY.seed(s, j, p) for s in (0, 1, 2**40) for j in (0, 1) for p in PURPOSES}
    assert len(seeds) == 3 * 2 * len(PURPOSES)
    assert all(0 <= s < 2**256 for s in seeds) and max(seeds).bit_length() > 250
    other_round = RoundKey(bytes(range(1, 33)), 4)
    assert other_round.seed(0, 0, "rollout") != KEY.seed(0, 0, "rollout")
    with pytest.raises(PrivacyError):
        KEY.seed(0, 0, "noise")          # not a record purpose
    with pytest.raises(PrivacyError):
        KEY.seed(-1, 0, "rollout")
    assert bytes(range(32)).hex() not in repr(KEY) and str(bytes(range(32))) not in repr(KEY)


def test_coins_are_uniform_53_bit_and_rows_independent():
    """The keystream's uniforms: mean 1/2 and variance 1/12 within 5 standard errors over
    200,000 draws (deterministic: a fixed key), 53-bit grid, and G rows of a prompt distinct."""
    u = KEY.uniforms(3, 0, "rollout", 200_000)
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / u.size)
    assert abs(u.var() - 1 / 12) < 5 * np.sqrt(1 / 180 / u.size)
    assert np.all((u * 2.0**53) == np.floor(u * 2.0**53)) and u.min() >= 0 and u.max() < 1
    table = row_coins([KEY.seed(3, 0, "rollout")], 4, 64)
    assert len({tuple(r.tolist()) for r in table}) == 4


class _CountingUrandom:
    """os.urandom that counts the bytes each call reads and returns chosen bytes."""

    def __init__(self, fill: int = 0xA5) -> None:
        self.calls: list[int] = []
        self.fill = fill
        self.flip: int | None = None     # byte index of the next read to flip

    def __call__(self, n: int) -> bytes:
        self.calls.append(n)
        out = bytearray([self.fill] * n)
        if self.flip is not None and self.flip < n:
            out[self.flip] ^= 0x01
        return bytes(out)


def test_secure_round_keys_read_at_least_128_bits_of_os_urandom(monkeypatch):
    """Each round's key reads >= 16 bytes of os.urandom (here 32), and every one of those
    bytes changes every record's coins: no truncation to a 64- or 32-bit seed, no public
    constant. (Mutation: a secure round key from a constant -> no read, coins unchanged.)"""
    fake = _CountingUrandom()
    monkeypatch.setattr(os, "urandom", fake)
    source = RecordRandomness()
    assert source.secure and source.releasable and source.secret_bits == 256
    base = source.round_key(0)
    assert fake.calls == [KEY_BYTES] and KEY_BYTES >= 16
    for round_index in (1, 2):
        source.round_key(round_index)
    assert fake.calls == [KEY_BYTES] * 3                 # fresh bits every round
    seed0 = base.seed(0, 0, "rollout")
    for byte in range(KEY_BYTES):
        fake.flip = byte
        flipped = source.round_key(0)
        assert flipped.seed(0, 0, "rollout") != seed0, byte
        assert flipped.seed(0, 0, "dropout") != base.seed(0, 0, "dropout"), byte
    fake.flip, fake.fill = None, 0x5A
    assert source.round_key(0).seed(0, 0, "rollout") != seed0   # other bytes, other coins


def test_an_entropy_source_that_returns_too_little_is_refused():
    with pytest.raises(PrivacyError):
        RecordRandomness(entropy=lambda n: bytes(8)).round_key(0)


def test_seeded_keys_are_reproducible_per_round_and_not_releasable(monkeypatch):
    fake = _CountingUrandom()
    monkeypatch.setattr(os, "urandom", fake)
    a, b = RecordRandomness(seed=7), RecordRandomness(seed=7)
    assert a.round_key(5).key == b.round_key(5).key != a.round_key(6).key
    assert a.round_key(5).key != RecordRandomness(seed=8).round_key(5).key
    assert fake.calls == [] and not a.secure and not a.releasable and a.secret_bits == 0
    assert a.state_dict() == {"source": "seeded", "seed": 7}   # no key: a function of t
    with pytest.raises(PrivacyError):
        RecordRandomness().load_state_dict(a.state_dict())


def test_torch_seed_is_a_64_bit_prf_output():
    seeds = [torch_seed(KEY.seed(s, 0, "dropout")) for s in range(64)]
    assert len(set(seeds)) == 64 and all(0 <= s < 2**64 for s in seeds)
    assert max(seeds).bit_length() > 60


def test_contributor_choice_is_bound_to_the_record():
    """A contributor's k problems come from its own stream: the same whatever the problem
    counts of the contributors drawn before it (a shared stream shifted them)."""
    chooser = ProblemChooser(2, seed=0)        # its own stream fixed: a deterministic verdict
    target = Contributor("t", tuple(range(10)))
    big, small = Contributor("b", tuple(range(100, 150))), Contributor("s", (7, 8, 9))
    alone = round_prompts([target], chooser, [KEY.reader(4, 0, "choose")])
    crowd = round_prompts([big, small, target], chooser,
                          [KEY.reader(s, 0, "choose") for s in (1, 2, 4)])
    assert alone.prompts == crowd.prompts[-2:] and len(crowd.prompts) == 2 + 2 + 2
    picks = {tuple(round_prompts([target], chooser, [RoundKey(bytes([i]) * 32).reader(4, 0,
                   "choose")]).prompts) for i in range(30)}
    assert len(picks) > 10                                  # still a random subset
    with pytest.raises(PrivacyError):
        round_prompts([target, big], chooser, [KEY.reader(4, 0, "choose")])


def test_nonce_layout_keeps_records_apart():
    """Slots up to 2^64 - 1 and parts up to 2^24 - 1 map to distinct nonces; beyond, refused."""
    assert record_coins._nonce(2**64 - 1, 0, "rollout") != record_coins._nonce(0, 0, "rollout")
    assert len({record_coins._nonce(s, j, p) for s in (0, 1) for j in (0, 1)
                for p in PURPOSES}) == 4 * len(PURPOSES)
    with pytest.raises(PrivacyError):
        record_coins._nonce(2**64, 0, "rollout")
    with pytest.raises(PrivacyError):
        record_coins._nonce(0, 2**24, "rollout")


def test_request_seeds_of_neighbouring_prompts_never_overlap():
    """vLLM's per-request seeds: 63-bit PRF outputs of (prompt seed, row); prompt seeds s and
    s + 1 share no request seed (``seed + row``, as before, gave s + 1 == (s + 1) + 0)."""
    from dpgrpo.rollout.engine import request_seed

    rows = 8
    a = [request_seed(100, j) for j in range(rows)]
    b = [request_seed(101, j) for j in range(rows)]
    assert len(set(a) | set(b)) == 2 * rows and all(0 <= s < 2**63 for s in a + b)
    assert a == [request_seed(100, j) for j in range(rows)]
    big = KEY.seed(1, 0, "rollout")
    assert request_seed(big, 0) != request_seed(big + 1, 0)
