"""Keep third-party chatter that is not the user's concern off the screen, only around our calls.

Loading a model prints transformers' "Loading weights" bar and, for a GGUF file, a
dequantization bar. :func:`quiet_model_loading` silences both for the duration of one call and
restores the previous settings afterwards; nothing is disabled globally.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_model_loading() -> Iterator[None]:
    """No progress bars from transformers (weights, GGUF dequantization) inside the block."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a core dependency
        yield
        return
    was_enabled = hf_logging.is_progress_bar_enabled()
    original = getattr(gguf, "tqdm", None)
    hf_logging.disable_progress_bar()
    if original is not None:
        gguf.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        if original is not None:
            gguf.tqdm = original
        if was_enabled:
            hf_logging.enable_progress_bar()


__all__ = ["quiet_model_loading"]
