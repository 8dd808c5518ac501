"""Batch size as a resource: how many steps, and how many examples, reach a target loss.

Online least squares with noisy labels: x ~ N(0, I_d), y = x . w* + noise. The excess loss of
w is |w - w*|^2. A minibatch gradient of B examples is the true gradient plus noise whose
variance shrinks like 1/B. For each B we try a grid of learning rates (in parallel) and
keep the best, as batch-size studies do (McCandlish et al., "An Empirical Model of
Large-Batch Training", 2018). Small batches are noise-limited: doubling B halves the steps.
Past the critical batch size the steps stop falling, and the examples consumed (B x steps)
start to grow: more batch helps less than more steps.
"""

import numpy as np

from ..errors import ConfigError


def steps_to_target(batch, target=0.05, d=16, condition=50.0, noise=1.0, replicas=4, max_steps=20000,
                    lrs=None, seed=0):
    """Fewest SGD steps (over a learning-rate grid) to bring the mean excess loss of
    ``replicas`` independent runs under ``target`` x its starting value.

    Inputs have covariance diag(lambda), lambda from 1 down to 1/condition: the largest
    lambda caps the stable learning rate, the smallest sets how many steps even exact
    gradients need. That floor is what makes large batches stop paying. Returns
    (steps, best lr)."""
    rng = np.random.default_rng(seed)
    lrs = np.asarray(lrs if lrs is not None else np.geomspace(0.01, 1.5, 14))
    lam = np.geomspace(1.0, 1.0 / condition, d)
    w_star = rng.standard_normal(d)
    start = (lam * w_star**2).sum()
    W = np.zeros((len(lrs), replicas, d))  # every learning rate and replica at once
    done = np.full(len(lrs), max_steps + 1)
    with np.errstate(over="ignore", invalid="ignore"):
        for step in range(1, max_steps + 1):
            X = rng.standard_normal((replicas, batch, d)) * np.sqrt(lam)
            y = X @ w_star + noise * rng.standard_normal((replicas, batch))
            resid = np.einsum("lrd,rbd->lrb", W, X) - y  # (lr, replica, batch)
            W -= lrs[:, None, None] * np.einsum("lrb,rbd->lrd", resid, X) / batch
            excess = (lam * (W - w_star) ** 2).sum(axis=2).mean(axis=1)
            excess[~np.isfinite(excess)] = np.inf
            newly = (excess < target * start) & (done > max_steps)
            done[newly] = step
            if (done <= max_steps).any() and step > 2 * done.min():
                break  # the best learning rate has long finished
    best = int(np.argmin(done))
    if done[best] > max_steps:
        raise ConfigError(f"no learning rate reached the target within {max_steps} steps at batch {batch}; "
                          f"raise max_steps or loosen the target")
    return int(done[best]), float(lrs[best])


def critical_batch_sweep(batches=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), **kwargs):
    """steps and examples to the target for each batch size, plus the fit of
    steps = S_min (1 + B_crit / B), whose B_crit is the critical batch size."""
    steps = np.array([steps_to_target(b, **kwargs)[0] for b in batches], dtype=float)
    B = np.asarray(batches, dtype=float)
    # steps = a + c / B (a = S_min, c = S_min * B_crit), fitted in relative error
    A = np.stack([np.ones_like(B), 1 / B], axis=1) / steps[:, None]
    (s_min, c), *_ = np.linalg.lstsq(A, np.ones_like(B), rcond=None)
    return {"batch": B, "steps": steps, "examples": steps * B, "s_min": s_min, "b_crit": c / s_min}
