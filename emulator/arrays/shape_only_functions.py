"""The NumPy functions a shape-only array answers to (``__array_function__``): each gives
the shape and dtype NumPy would, with no values (see :mod:`emulator.arrays.shape_only`). Importing
this module fills that module's ``FUNCTIONS``, as NumPy's NEP 18 registry of handled functions does;
``emulator.arrays`` imports it, so every shape-only array answers to these."""

import math

import numpy as np

from .shape_only import FUNCTIONS, ShapeArray, _argsort_like


def _shape_of(x):
    return x.shape if isinstance(x, ShapeArray) else np.shape(x)


def _dtype_of(*xs):
    return np.result_type(*[x.dtype if isinstance(x, (ShapeArray, np.ndarray)) else x for x in xs])


def _concatenate(arrays, axis=0, **kw):
    shapes = [_shape_of(a) for a in arrays]
    if axis is None:
        return ShapeArray((sum(math.prod(s) for s in shapes),), _dtype_of(*arrays))
    axis %= len(shapes[0])
    shape = list(shapes[0])
    shape[axis] = sum(s[axis] for s in shapes)
    return ShapeArray(shape, _dtype_of(*arrays))


def _stack(arrays, axis=0, **kw):
    shape = list(_shape_of(arrays[0]))
    shape.insert(axis % (len(shape) + 1), len(arrays))
    return ShapeArray(shape, _dtype_of(*arrays))


def _where(cond, x=None, y=None):
    if x is None:
        return tuple(np.zeros(0, np.int64) for _ in _shape_of(cond))  # selects nothing
    return ShapeArray(np.broadcast_shapes(_shape_of(cond), _shape_of(x), _shape_of(y)), _dtype_of(x, y))


def _moveaxis(a, source, destination):
    order = [n for n in range(a.ndim) if n != source % a.ndim]
    order.insert(destination % a.ndim, source % a.ndim)
    return a.transpose(order)


def _like(a, dtype=None, order="K", subok=True, shape=None, **kw):
    if shape is None:
        shape = _shape_of(a)
    return ShapeArray(tuple(shape) if np.ndim(shape) else (shape,), dtype or a.dtype)


def _full_like(a, fill_value, dtype=None, order="K", subok=True, shape=None):
    return _like(a, dtype, shape=shape)


def _take_along_axis(arr, indices, axis):
    return ShapeArray(np.broadcast_shapes(_shape_of(arr)[:axis % arr.ndim] + (1,) +
                                          _shape_of(arr)[axis % arr.ndim + 1:], _shape_of(indices)), arr.dtype)


def _split(a, sections, axis=0):
    n = a.shape[axis] // sections if isinstance(sections, int) else None
    starts = [i * n for i in range(sections)] if n is not None else [0] + list(sections)
    ends = starts[1:] + [a.shape[axis]]
    index = [slice(None)] * a.ndim
    out = []
    for s, e in zip(starts, ends):
        index[axis] = slice(s, e)
        out.append(a[tuple(index)])
    return out


def _repeat(a, repeats, axis=None):
    if axis is None:
        return ShapeArray((a.size * repeats,), a.dtype)
    shape = list(a.shape)
    shape[axis] *= repeats
    return ShapeArray(shape, a.dtype)


def _argsort(a, axis=-1, kind=None, order=None, **kw):
    return _argsort_like(a, axis)[0]


FUNCTIONS.update({
    np.concatenate: _concatenate, np.stack: _stack, np.where: _where, np.moveaxis: _moveaxis,
    np.ascontiguousarray: lambda a, dtype=None, **kw: a.copy() if not a._contiguous() else a.astype(
        dtype or a.dtype, copy=False),
    np.zeros_like: _like, np.empty_like: _like, np.ones_like: _like, np.full_like: _full_like,
    np.take_along_axis: _take_along_axis, np.split: _split, np.array_split: _split, np.repeat: _repeat,
    np.broadcast_to: lambda a, shape, **kw: a._view(shape, (0,) * (len(shape) - a.ndim) + tuple(
        0 if n == 1 and m != 1 else s for n, m, s in zip(a.shape, shape[len(shape) - a.ndim:], a.strides))),
    np.reshape: lambda a, shape, *args, **kw: a.reshape(shape), np.transpose: lambda a, axes=None: a.transpose(axes),
    np.swapaxes: lambda a, x, y: a.swapaxes(x, y), np.shape: lambda a: a.shape, np.ndim: lambda a: a.ndim,
    np.size: lambda a, axis=None: a.size if axis is None else a.shape[axis], np.copy: lambda a, **kw: a.copy(),
    np.sum: lambda a, axis=None, dtype=None, keepdims=False, **kw: a.sum(axis, dtype, keepdims),
    np.mean: lambda a, axis=None, dtype=None, keepdims=False, **kw: a.mean(axis, dtype, keepdims),
    np.max: lambda a, axis=None, keepdims=False, **kw: a.max(axis, keepdims=keepdims),
    np.amax: lambda a, axis=None, keepdims=False, **kw: a.max(axis, keepdims=keepdims),
    np.min: lambda a, axis=None, keepdims=False, **kw: a.min(axis, keepdims=keepdims),
    np.prod: lambda a, axis=None, dtype=None, keepdims=False, **kw: a.prod(axis, dtype, keepdims),
    np.argsort: _argsort, np.nonzero: lambda a: tuple(np.zeros(0, np.int64) for _ in a.shape),
    np.ravel: lambda a, order="C": a.ravel(), np.squeeze: lambda a, axis=None: a.squeeze(axis),
    np.expand_dims: lambda a, axis: a.reshape(a.shape[:axis] + (1,) + a.shape[axis:]),
    np.triu: lambda a, k=0: a.copy(), np.tril: lambda a, k=0: a.copy(),
})
