"""The CUDA transport: CuPy's NCCL binding, one communicator per GPU, all driven from one process.

UNTESTED HERE: written on a machine without GPUs; bench/gpu_tp.sh and tests/test_tp_gpu.py (marked
gpu) verify it on a host with two or more. Nothing else in engine.parallel depends on it, and it
imports CuPy only when built.
"""

from __future__ import annotations

from typing import Any


def nccl_available() -> str | None:
    """None when NCCL can be used, else why not."""
    try:
        from cupy.cuda import nccl  # noqa: F401
    except Exception as e:  # ImportError, or CuPy built without NCCL
        return f"CuPy's NCCL binding does not import ({e})"
    return None


class NcclCollective:
    """xs[r] lives on devices[r]; each rank's collective is queued on that device's current stream
    inside one NCCL group (the rule for one thread driving several communicators)."""

    def __init__(self, devices: tuple[int, ...]):
        from cupy.cuda import nccl

        self._nccl, self.devices, self.tp = nccl, tuple(devices), len(devices)
        self.comms = nccl.NcclCommunicator.initAll(list(self.devices))

    def _each(self, xs: list[Any], make_out, call) -> list[Any]:
        import cupy as cp

        outs = []
        for d, x in zip(self.devices, xs, strict=True):
            with cp.cuda.Device(d):
                outs.append(make_out(x))
        self._nccl.groupStart()
        try:
            for comm, d, x, out in zip(self.comms, self.devices, xs, outs, strict=True):
                with cp.cuda.Device(d):
                    call(comm, cp.ascontiguousarray(x), out, cp.cuda.get_current_stream().ptr)
        finally:
            self._nccl.groupEnd()
        return outs

    def all_gather(self, xs: list[Any]) -> list[list[Any]]:
        import cupy as cp

        n, f32 = xs[0].size, self._nccl.NCCL_FLOAT32
        outs = self._each(xs, lambda x: cp.empty((self.tp, *x.shape), cp.float32),
                          lambda comm, x, out, s: comm.allGather(x.data.ptr, out.data.ptr, n, f32, s))
        return [list(out) for out in outs]

    def all_reduce(self, xs: list[Any]) -> list[Any]:
        import cupy as cp

        n, nc = xs[0].size, self._nccl
        return self._each(xs, lambda x: cp.empty_like(x, cp.float32),
                          lambda comm, x, out, s: comm.allReduce(x.data.ptr, out.data.ptr, n, nc.NCCL_FLOAT32,
                                                                 nc.NCCL_SUM, s))


class OnDevice:
    """A rank's CudaOps whose every call runs with its GPU current (one thread drives all ranks)."""

    def __init__(self, ops: Any):
        self._ops = ops

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._ops, name)
        if not callable(value):
            return value

        def on_device(*args, **kwargs):
            with self._ops.device:
                return value(*args, **kwargs)

        return on_device


def cuda_ranks(devices: tuple[int, ...], exact: bool) -> tuple[list[Any], NcclCollective]:
    """Each rank's ops on its GPU, and the communicators between them."""
    problem = nccl_available()
    if problem:
        raise RuntimeError(problem)
    import cupy as cp

    from lockstep_kernels.cuda.ops import CudaOps

    ranks = [OnDevice(CudaOps(exact=exact, device=d)) for d in devices]  # each makes its device current
    coll = NcclCollective(devices)
    cp.cuda.Device(devices[0]).use()  # the runner's own arrays (inputs, logits) live on rank 0's GPU
    return ranks, coll


def device_count() -> int:
    import cupy as cp

    return int(cp.cuda.runtime.getDeviceCount())
