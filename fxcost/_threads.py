"""Cost models' array work on one thread: an estimate must not slow down when its neighbours are busy.

A search loop runs several estimators at once (Optuna's ``n_jobs``, Ray workers) on a machine whose
cores are already taken. numpy's OpenBLAS and torch each start a thread per core; the heads' network
calls (:mod:`fxcost.cost_models.heads`) are a few thousand rows, where a second thread gains little
and costs much once the cores are shared: the caller waits for a helper thread the scheduler has not
run yet, and OpenBLAS's helpers spin after each call, taking the CPU the other estimators need.
Measured on a 2-core machine already running other jobs (``benchmarks/cost_speed.py --parallel 4``,
GPT-2, four estimating processes at once): with the libraries' threads, 48 ms per new-GPU estimate
(median), 12.5 s for the first new GPU's tables and 396 ms per new batch; on one thread, 23 ms,
6.8 s and 47 ms.

:func:`single_threaded` sets torch's intra-op threads to 1 and, where ``threadpoolctl`` is installed,
numpy's BLAS threads too, and restores both after. Results are those the libraries give on one
thread, on any machine: on several threads OpenBLAS may take another kernel for a product and round
differently (2 of 702 estimates checked differed, by 3e-11 relative), so before this an estimate's
last bits depended on the machine's core count.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["single_threaded"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_depth = 0  # callers inside single_threaded(), across threads: numpy's BLAS count is the process's
_blas: Any = None  # threadpoolctl's limiter of numpy's BLAS, restored by the last one out
_controller: Any = None
_local = threading.local()  # torch's count is each thread's own (OpenMP's is per thread)


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Run the block with torch and numpy's BLAS on one thread, restoring their counts after.

    Safe from threads and nested calls. torch's count (OpenMP's) belongs to each thread: a thread's
    outermost call sets and restores its own. numpy's BLAS (OpenBLAS on its own thread pool, as in
    numpy's wheels) has one count for the process: the first caller in sets it, the last one out
    restores it, so a thread that leaves early does not hand the others back a thread pool; while
    any caller is inside, the process's BLAS calls run on one thread.

    Example:
        >>> with single_threaded():  # doctest: +SKIP
        ...     ms, sources = predict_batch(batch, chain, device)
    """
    import torch

    depth = getattr(_local, "depth", 0)
    if depth == 0:
        _local.torch_threads = torch.get_num_threads()
        if _local.torch_threads != 1:
            torch.set_num_threads(1)
    _local.depth = depth + 1
    try:
        _enter_blas()
        try:
            yield
        finally:
            _leave_blas()
    finally:
        _local.depth -= 1
        if _local.depth == 0 and torch.get_num_threads() != _local.torch_threads:
            torch.set_num_threads(_local.torch_threads)


def _enter_blas() -> None:
    global _depth, _blas
    with _lock:
        if _depth == 0:
            _blas = _limit_blas()
        _depth += 1


def _leave_blas() -> None:
    global _depth, _blas
    with _lock:
        _depth -= 1
        if _depth == 0 and _blas is not None:
            _release_openblas()
            _blas.restore_original_limits()
            _release_openblas()
            _blas = None


def _limit_blas() -> Any:
    """numpy's BLAS limited to one thread (a limiter to restore), or None without ``threadpoolctl``.

    The controller finds the loaded libraries once (a few ms); a limit then costs microseconds.
    """
    global _controller
    if _controller is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            log.debug("threadpoolctl is not installed: numpy's BLAS keeps its threads")
            _controller = False
            return None
        # OpenBLAS on its own pool alone: a limiter restores every library of its controller, and
        # torch's OpenMP count is torch's to restore; an OpenMP build's count is per thread.
        _controller = (
            ThreadpoolController().select(internal_api="openblas").select(threading_layer="pthreads")
        )
    if _controller is False or not _controller.lib_controllers:
        return None
    _release_openblas()
    return _controller.limit(limits=1)


def _release_openblas() -> None:
    """Let this thread set OpenBLAS's count: threadpoolctl 3.8 lets only the thread that last set it
    do so, and the last caller out of :func:`single_threaded` may be another thread than the first
    one in (the module lock keeps fxcost's own calls one at a time)."""
    from threadpoolctl import OpenBLASController

    release = getattr(OpenBLASController, "clear_controlling_thread", None)  # threadpoolctl >= 3.8
    if release is not None:
        release(force=True)
