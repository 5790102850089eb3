"""Sanity checks of reference/model.py, the numpy Llama forward pass."""

import numpy as np
import pytest

import model as reference
from convert_testlib import STORIES, need_shared


def test_stories260k_tells_of_lily():
    need_shared(STORIES)
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_file(f"{STORIES}/tokenizer.json")
    prompt = tokenizer.encode("Once upon a time").ids
    assert prompt[0] == 1
    config, weights = reference.load(STORIES)
    text = tokenizer.decode(prompt + reference.greedy(config, weights, prompt, 40))
    assert text.startswith("Once upon a time, there was a little girl named Lily.")


def test_logits_for_shape_and_causality():
    need_shared(STORIES)
    ids = [1, 403, 407, 261, 378]
    logits = reference.logits_for(STORIES, ids)
    assert logits.shape == (5, 512) and logits.dtype == np.float64
    np.testing.assert_allclose(reference.logits_for(STORIES, ids[:3]), logits[:3], atol=1e-12)


def rope_config(scaling):
    """A RoPE-only config for inverse_frequencies."""
    return {"head_dim": 64, "rope_theta": 500000.0, "rope_scaling": scaling}


def test_rope_scaling():
    base = reference.inverse_frequencies(rope_config(None))
    assert np.allclose(base, 500000.0 ** (-np.arange(0, 64, 2) / 64))
    linear = reference.inverse_frequencies(rope_config({"type": "linear", "factor": 4.0}))
    assert np.allclose(linear, base / 4)
    llama3 = reference.inverse_frequencies(rope_config(
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}))
    wavelength = 2 * np.pi / base
    assert np.allclose(llama3[wavelength < 2048], base[wavelength < 2048])
    assert np.allclose(llama3[wavelength > 8192], base[wavelength > 8192] / 8)
    middle = (wavelength >= 2048) & (wavelength <= 8192)
    assert middle.any()
    assert np.all((llama3[middle] <= base[middle]) & (llama3[middle] >= base[middle] / 8))


def test_sliding_window_mask():
    mask = reference.attention_mask({"sliding_window": 3}, 6)
    assert mask[5].tolist() == [False, False, False, True, True, True]
    assert np.array_equal(reference.attention_mask({"sliding_window": None}, 6),
                          np.tril(np.ones((6, 6), dtype=bool)))
    # Qwen2's max_window_layers: layers before the first windowed one see everything.
    qwen2 = {"sliding_window": 3, "sliding_window_first_layer": 2}
    assert np.array_equal(reference.attention_mask(qwen2, 6, layer=1),
                          np.tril(np.ones((6, 6), dtype=bool)))
    assert reference.attention_mask(qwen2, 6, layer=2)[5].tolist() == [False] * 3 + [True] * 3
