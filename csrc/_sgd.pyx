"""The optimizer's update in one pass over its buffers (``hxmpi.train.optim.SGD.step``).

The numpy form of a momentum-SGD step with weight decay makes two temporaries the size of the
model and passes over parameter-sized buffers six times; this reads the gradient, parameters and
velocity once and writes the latter two once, with the GIL released. Each operation rounds to the
buffers' dtype as numpy's does, so the result is the numpy form's bit for bit (the build turns
off contraction into fused multiply-adds, which round once).
"""
from cython cimport floating

__all__ = ["sgd_update"]


def sgd_update(floating[::1] params, const floating[::1] grads, floating[::1] velocity,
               double lr, double momentum, double weight_decay):
    """In place, element by element: ``g = grads + weight_decay * params`` (skipped when
    ``weight_decay`` is 0), ``velocity = momentum * velocity + g``, ``params -= lr * velocity``.
    The three arrays are C-contiguous, of one dtype (float32 or float64) and one length; the
    scalars are taken in that dtype. ``grads`` is not written."""
    cdef Py_ssize_t i, n = params.shape[0]
    if grads.shape[0] != n or velocity.shape[0] != n:
        raise ValueError(f"sgd_update needs arrays of one length, got params {n}, grads {grads.shape[0]}, "
                         f"velocity {velocity.shape[0]}")
    cdef floating rate = <floating>lr, mom = <floating>momentum, decay = <floating>weight_decay, g
    cdef bint decayed = weight_decay != 0.0
    with nogil:
        for i in range(n):
            g = grads[i]
            if decayed:
                g = g + decay * params[i]
            velocity[i] = mom * velocity[i] + g
            params[i] = params[i] - rate * velocity[i]
