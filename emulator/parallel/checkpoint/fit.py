"""What a save records of the run that made it (:func:`run_record`), and whether a restart
may go on from it with the model and optimizer it is given (:func:`check_fit`).

Three kinds of difference, each found before any rank runs:

* **the parameters**: a name the save lacks or has in excess, another shape. Never
  loadable (there is nothing to put in the new places): the error names them and the
  settings the save was made with.
* **settings**: the model's settings that leave the shapes alone (``n_heads``, ``mlp``,
  ``top_k``, ``capacity_factor``, ``aux_loss_coef``, ...) and the optimizer's type and
  hyperparameters (``lr``, ``betas``, ``eps``, ``weight_decay``). Loadable, but the run
  that goes on is another run: refused unless the caller names each change in
  ``run_on_mesh(..., allow_changes={"lr"})`` (a new learning-rate schedule, say).
* **precision**: the parameters' dtype, the optimizer state's, fp32 master weights or
  not. Refused unless ``allow_changes`` holds ``"precision"``; then the saved
  parameters are cast to the model's dtype, the moments to the optimizer's, and master
  weights the save lacks are made from the parameters, as a fresh optimizer makes them.

The record is JSON in the manifest (``manifest["run"]``). Its ``precision`` entry has a
``policy`` slot: a :class:`~emulator.machine.precision.Precision` policy's fields, where the
run has one (``run_record(..., policy=)``: ``run_on_mesh``'s policy; None where the run keeps every number as its arrays hold it),
compared whole in :func:`_precision_changes`.
"""

from dataclasses import fields, is_dataclass

import numpy as np

from ...errors import ConfigError

MODEL_SETTINGS = ("vocab", "d_model", "n_heads", "n_kv_heads", "d_ff", "n_layers", "max_seq", "mlp", "n_experts",
                  "top_k", "capacity_factor", "aux_loss_coef")
OPTIMIZER_SETTINGS = (("lr", "lr"), ("betas", "betas"), ("eps", "eps"), ("weight_decay", "wd"))
PRECISION = "precision"
CHANGES = tuple(MODEL_SETTINGS) + ("optimizer",) + tuple(n for n, _ in OPTIMIZER_SETTINGS) + (PRECISION,)


def _plain(v):
    if isinstance(v, (np.integer, np.floating)):
        return v.item()
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v


def _dtype_name(d):
    return np.dtype(d).name  # "bfloat16" for ml_dtypes' bfloat16


def policy_record(policy):
    """A precision policy (a dataclass such as :class:`~emulator.machine.precision.Precision`)
    as JSON: its fields; None for none."""
    if policy is None:
        return None
    if not is_dataclass(policy):
        raise ConfigError(f"a precision policy is a Precision (emulator.machine.precision), got {policy!r}")
    return {f.name: _plain(getattr(policy, f.name)) for f in fields(policy)}


def precision_record(dtypes, optimizer, policy=None):
    """``dtypes``: each parameter's dtype. What an AdamW keeps: moments in fp32 with fp32
    master weights under mixed precision, else in the parameters' dtype; ``policy``: the
    run's precision policy, if it has one."""
    names = sorted({_dtype_name(d) for d in dtypes.values()})
    mixed = bool(getattr(optimizer, "mixed_precision", False))
    return {"params": names, "optimizer_state": ["float32"] if mixed else names,
            "master_weights": "float32" if mixed else None, "policy": policy_record(policy)}


def run_record(model, optimizer, dtypes, policy=None):
    """The model's settings, the optimizer's type and hyperparameters, the precision."""
    opt = {"type": type(optimizer).__name__}
    opt.update({name: _plain(getattr(optimizer, attr)) for name, attr in OPTIMIZER_SETTINGS
                if hasattr(optimizer, attr)})
    return {"model": {k: _plain(getattr(model, k)) for k in MODEL_SETTINGS if hasattr(model, k)},
            "optimizer": opt, "precision": precision_record(dtypes, optimizer, policy)}


def allowed(allow_changes):
    """``allow_changes`` as a set of names, each one :data:`CHANGES` knows."""
    if allow_changes is None:
        return set()
    names = {allow_changes} if isinstance(allow_changes, str) else allow_changes
    if not isinstance(names, (set, frozenset, list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"allow_changes= is a set of names of settings that may differ from the checkpoint's, e.g. "
                          f"{{'lr'}}, got {allow_changes!r}; the names: {list(CHANGES)}")
    unknown = sorted(set(names) - set(CHANGES))
    if unknown:
        raise ConfigError(f"allow_changes= names {unknown}, which a checkpoint does not record; the names: "
                          f"{list(CHANGES)}")
    return set(names)


def _shape_problems(tensors, shapes):
    problems = []
    for name, (shape, _) in shapes.items():
        t = tensors.get(f"model.{name}")
        if t is None:
            problems.append(f"no saved tensor for parameter {name}")
        elif tuple(t["shape"]) != tuple(shape):
            problems.append(f"{name} was saved as {tuple(t['shape'])}, the model has {tuple(shape)}")
    extra = sorted(k[len("model."):] for k in tensors if k.startswith("model.") and k[len("model."):] not in shapes)
    if extra:
        problems.append(f"saved parameters the model does not have: {extra[:4]}")
    return problems


def _setting_changes(saved, now):
    out = []
    for group in ("model", "optimizer"):
        for k in sorted(set(saved.get(group, {})) | set(now[group])):
            key = "optimizer" if (group, k) == ("optimizer", "type") else k
            a, b = saved.get(group, {}).get(k), now[group].get(k)
            if a != b:
                out.append((key, f"{key}: {a!r} when saved, {b!r} now"))
    return out


def _precision_changes(tensors, saved, shapes, optimizer, policy):
    out = []
    params = sorted({(t["dtype"], _dtype_name(shapes[k[6:]][1])) for k, t in tensors.items()
                     if k.startswith("model.") and k[6:] in shapes and t["dtype"] != _dtype_name(shapes[k[6:]][1])})
    for was, now in params:
        out.append(f"precision: parameters were saved in {was}, the model's are {now}")
    has_master = any(k.startswith("optim.master.") for k in tensors)
    if bool(getattr(optimizer, "mixed_precision", False)) != has_master:
        out.append(f"precision: the optimizer's mixed precision (fp32 master weights) differs from the saved one's "
                   f"(saved {'with' if has_master else 'without'} master weights)")
    if saved.get("policy") != policy:  # compared whole
        out.append(f"precision: the policy was {saved.get('policy')!r} when saved, {policy!r} now")
    return [(PRECISION, p) for p in out]


def check_fit(checkpoint, model, optimizer, shapes, allow_changes=None, policy=None):
    """Refuse to resume ``model`` with ``optimizer`` (and the precision ``policy``) from
    ``checkpoint`` where they differ (``shapes``: the model's ``{name: (shape, dtype)}``),
    except the changes allowed."""
    allow = allowed(allow_changes)
    problems = _shape_problems(checkpoint.tensors, shapes)
    saved = checkpoint.manifest.get("run", {})
    if problems:
        raise ConfigError(f"checkpoint {checkpoint.path} does not fit this model and optimizer:\n" +
                          "\n".join(f"  - {p}" for p in problems[:8]) +
                          f"\nA save loads only into a model with the same parameters and shapes (allow_changes= "
                          f"cannot change that): build the model it was saved from ({saved.get('model')}), or start "
                          f"from params instead of resume_from=")
    now = run_record(model, optimizer, {k: d for k, (_, d) in shapes.items()}, policy)
    if model is None:  # only the parameters' shapes are known: the model's settings are not compared
        now["model"] = dict(saved.get("model", {}))
    changes = _setting_changes(saved, now) + _precision_changes(checkpoint.tensors, saved.get("precision", {}),
                                                                 shapes, optimizer, now["precision"]["policy"])
    refused = [(k, text) for k, text in changes if k not in allow]
    if refused:
        names = sorted({k for k, _ in refused} | allow)
        raise ConfigError(f"checkpoint {checkpoint.path} was saved by a run that differs from this one:\n" +
                          "\n".join(f"  - {text}" for _, text in refused) +
                          f"\nResuming would go on with the new settings. If that is intended, say so: "
                          f"run_on_mesh(..., resume_from=..., allow_changes={{{', '.join(map(repr, names))}}}); "
                          f"otherwise resume with "
                          f"the saved settings")
