"""Shared checks of the rollout format (every engine returns the same RolloutBatch)."""

from __future__ import annotations

import pytest
import torch

from dpgrpo.rollout import RolloutBatch


def check_consistent(ro: RolloutBatch, tok, max_new_tokens: int) -> None:
    n = ro.num_prompts * ro.group_size
    assert ro.input_ids.shape == ro.attention_mask.shape == ro.completion_mask.shape
    assert ro.input_ids.shape[0] == n and ro.completion_lengths.shape == (n,)
    assert len(ro.texts) == ro.num_prompts and all(len(t) == ro.group_size for t in ro.texts)
    cm, am = ro.completion_mask.bool(), ro.attention_mask.bool()
    assert not (cm & ~am).any()                                   # completion within attention
    assert torch.equal(ro.completion_mask.sum(1), ro.completion_lengths)
    assert (ro.completion_lengths >= 1).all() and (ro.completion_lengths <= max_new_tokens).all()
    start = int(cm.any(0).nonzero()[0])                           # all completions start here
    assert torch.equal(cm[:, start], torch.ones(n, dtype=torch.bool))
    assert not cm[:, :start].any()
    for row in range(n):
        comp = ro.input_ids[row][cm[row]]
        is_eos = comp == tok.eos_token_id
        if ro.hit_cap[row]:
            assert len(comp) == max_new_tokens and not is_eos.any()
        else:
            assert is_eos[-1] and not is_eos[:-1].any()           # stopped at the first EOS
        text = ro.texts[row // ro.group_size][row % ro.group_size]
        assert text == tok.decode(comp, skip_special_tokens=True)
        assert "<|im_end|>" not in text
        pos = am[row].nonzero().squeeze(1)                        # no holes in attention
        assert int(pos[-1] - pos[0]) + 1 == len(pos)


@pytest.fixture
def check_rollouts():
    """``check(batch, tok, max_new_tokens)``: masks, lengths, stops and texts agree."""
    return check_consistent
