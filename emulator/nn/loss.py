"""Cross-entropy over the vocabulary, mean over tokens."""

import numpy as np

from ..errors import ConfigError


def cross_entropy(logits, targets):
    """loss = mean_i -log softmax(logits_i)[targets_i]. Returns (loss, cache)."""
    logits = np.asarray(logits)
    targets = np.asarray(targets)
    if logits.shape[:-1] != targets.shape:
        raise ConfigError(f"cross_entropy: logits {logits.shape} need targets of shape {logits.shape[:-1]}, "
                         f"got {targets.shape}")
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return float(-picked.mean()), {"logp": logp, "targets": targets}


def cross_entropy_backward(cache, dloss=1.0):
    """d loss / d logits = (softmax - onehot(targets)) / n_tokens."""
    logp, targets = cache["logp"], cache["targets"]
    g = np.exp(logp)
    np.put_along_axis(g, targets[..., None], np.take_along_axis(g, targets[..., None], -1) - 1, axis=-1)
    return g * (dloss / targets.size)
