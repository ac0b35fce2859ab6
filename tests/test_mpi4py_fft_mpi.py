"""A real Alltoallw client: mpi4py-fft's pencil transfers (``mpi4py_fft.pencil``) routed through
``HierComm.Alltoallw`` the way a user does it, by handing ``Pencil`` HierComms over the
subcommunicators ``Subcomm`` made. The cases are those of mpi4py-fft's own pencil test (every 2-D
and 3-D global shape with sides 7, 8 and 9, every chain of three pencil axes, real and complex
types); each transfer there and back must be byte-equal to the same transfer over the plain
subcommunicators, and the round trip must give back the original array exactly.

Skips, saying so, where mpi4py-fft is not installed (``pip install mpi4py-fft``: it compiles
against FFTW's headers, Debian's ``libfftw3-dev``)."""
from __future__ import annotations

from itertools import product

import numpy as np
import pytest
from mpi4py import MPI

from hxmpi import HierComm

pytestmark = pytest.mark.mpi
pencil = pytest.importorskip(
    "mpi4py_fft.pencil", reason="mpi4py-fft is not installed (pip install mpi4py-fft; it builds against libfftw3-dev)")

SIDES = (7, 8, 9)
TYPECODES = "fdFD"
#: HierComm settings each subcommunicator is wrapped with: the default (real nodes, "auto"), and
#: virtual nodes of 2 with the hierarchical path forced.
SETTINGS = {"default": {}, "hier": {"ranks_per_node": 2, "algorithm": "hier"}}


def _cases(dim: int):
    """(global shape, axis chain) of mpi4py-fft's pencil test for ``dim`` dimensions."""
    for shape in product(SIDES, repeat=dim):
        for a1, a2, a3 in product(range(dim), repeat=3):
            if a1 != a2 and a2 != a3:
                yield shape, (a1, a2, a3)


@pytest.fixture(scope="module", params=[2, 3], ids=["2d", "3d"])
def subcomms(request):
    """mpi4py-fft's subcommunicators for ``dim``-dimensional pencils (distributed along dim-1
    axes), and per setting, HierComms over the same subcommunicators."""
    plain = pencil.Subcomm(MPI.COMM_WORLD, request.param - 1)
    wrapped = {name: tuple(HierComm(c, **options) for c in plain) for name, options in SETTINGS.items()}
    yield request.param, plain, wrapped
    for hcs in wrapped.values():
        for hc in hcs:
            hc.free()
    plain.destroy()


def _round_trip(subcomm, shape, axes, typecode, data):
    """Pencils along ``axes`` over ``subcomm``; ``data`` (this rank's part of the first pencil)
    transferred forward to the third pencil and back. Returns every array along the way."""
    first = pencil.Pencil(subcomm, shape).pencil(axes[0])
    second = first.pencil(axes[1])
    third = second.pencil(axes[2])
    there, on = first.transfer(second, typecode), second.transfer(third, typecode)
    try:
        a = data.copy()
        b = np.zeros(second.subshape, dtype=typecode)
        c = np.zeros(third.subshape, dtype=typecode)
        there.forward(a, b)
        on.forward(b, c)
        b_back = np.zeros_like(b)
        a_back = np.zeros_like(a)
        on.backward(c, b_back)
        there.backward(b_back, a_back)
        return [b, c, b_back, a_back], first.subshape
    finally:
        there.destroy()
        on.destroy()


@pytest.mark.parametrize("typecode", TYPECODES)
@pytest.mark.parametrize("setting", SETTINGS)
def test_pencil_transfers_through_hiercomm_equal_the_communicators(subcomms, setting, typecode):
    dim, plain, wrapped = subcomms
    rng = np.random.default_rng(MPI.COMM_WORLD.rank)
    for shape, axes in _cases(dim):
        local = pencil.Pencil(plain, shape).pencil(axes[0]).subshape
        data = (rng.standard_normal(local) * 100).astype(typecode)
        expected, _ = _round_trip(plain, shape, axes, typecode, data)
        got, _ = _round_trip(wrapped[setting], shape, axes, typecode, data)
        for e, g in zip(expected, got):
            assert g.tobytes() == e.tobytes(), (shape, axes)
        assert got[-1].tobytes() == data.tobytes(), (shape, axes)  # moved, never computed: exact


def test_a_pencil_takes_hiercomms_where_it_takes_communicators(subcomms):
    """What a Pencil asks of its communicators (size, rank) HierComm answers as the communicator
    does, and the Transfer it makes holds the HierComm, so its Alltoallw is hxmpi's."""
    dim, plain, wrapped = subcomms
    hcs = wrapped["default"]
    shape = SIDES[:dim]
    ours, theirs = pencil.Pencil(hcs, shape), pencil.Pencil(plain, shape)
    assert (ours.subshape, ours.substart) == (theirs.subshape, theirs.substart)
    transfer = ours.transfer(ours.pencil(0 if ours.axis else 1), "d")
    try:
        assert isinstance(transfer.comm, HierComm)
    finally:
        transfer.destroy()
