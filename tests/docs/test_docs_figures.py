"""Every figure the docs quote about the noise generator matches privacy/noise.py (issue 28).

README.md and docs/*.md describe the generator in words; the constants live in
:mod:`dpgrpo.privacy.noise` (and the record streams' key in :mod:`dpgrpo.privacy.record_coins`).
Each pattern below finds one kind of claim; a claim with another number is stale.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from dpgrpo.privacy import noise, record_coins

ROOT = Path(__file__).resolve().parents[2]
COORDINATE_MAX = noise.SECURE_DRAWS * noise.R_MAX / 2   # the largest |coordinate| in sigma C

#: claim pattern -> the values it may state
CLAIMS = {
    r"(\d+)-bit (?:OS |`?os\.urandom`? )?key": {8 * noise.KEY_BYTES, 8 * record_coins.KEY_BYTES},
    r"(\d+)-bit round key": {8 * record_coins.KEY_BYTES},
    r"(\d+)-bit radi(?:us|i)": {noise.RADIUS_BITS},
    r"sum of (\d+) (?:Box-Muller )?draws": {noise.SECURE_DRAWS},
    r"(\d+) different pairs": {noise.SECURE_DRAWS},
    r"(?:no draw exceeds|draws? (?:never )?(?:exceeds?|reach(?:es)?)) ([\d.]+) ?"
    r"(?:σ|sigma|standard)":  # noqa: RUF001 - the docs write sigma as the Greek letter
        {round(noise.R_MAX, 2), round(COORDINATE_MAX, 2)},
}


def stale_claims(text: str, source: str) -> list[str]:
    found = []
    for pattern, allowed in CLAIMS.items():
        for match in re.finditer(pattern, text):
            value = float(match.group(1))
            if not any(math.isclose(value, a, abs_tol=0.01) for a in allowed):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{source}:{line}: {match.group(0)!r} (noise.py: {sorted(allowed)})")
    return found


def test_the_docs_quote_the_generator_as_noise_py_defines_it():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = [c for page in pages
             for c in stale_claims(page.read_text(encoding="utf-8"), page.name)]
    assert found == []
    assert any(re.search(p, page.read_text(encoding="utf-8")) for p in CLAIMS for page in pages)


def test_a_stale_figure_is_caught():
    old = ("a fresh 256-bit key from os.urandom; Box-Muller with 128-bit radius uniforms, each "
           "coordinate the sum of 4 draws from 4 different pairs; no draw exceeds 13.3 σC")  # noqa: RUF001
    assert [c.split(": ", 1)[1] for c in stale_claims(old, "old")] == [
        "'128-bit radius' (noise.py: [256])", "'no draw exceeds 13.3 σ' (noise.py: [18.84, 37.68])"]  # noqa: RUF001
