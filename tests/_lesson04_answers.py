"""Right answers to lesson 04's exercises, written differently from the library's, that
more than one of its test files uses."""

import numpy as np


def update_by_logaddexp(m, l, acc, scores, v):
    """Right, written differently: the new sum as a log-sum-exp, the max taken after."""
    m_new = np.maximum(m, scores.max(-1))
    ref = np.where(np.isfinite(m_new), m_new, 0.0)
    with np.errstate(divide="ignore"):
        log_l = np.logaddexp(np.log(l) + m - ref, np.log(np.exp(scores - ref[..., None]).sum(-1)))
    keep = np.exp(np.where(np.isfinite(m), m - ref, -np.inf))
    return m_new, np.exp(log_l), acc * keep[..., None] + np.exp(scores - ref[..., None]) @ v
