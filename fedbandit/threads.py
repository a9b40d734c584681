"""Threading policy of the command line and its worker processes: BLAS, and fedbandit's own
compiled kernels over blocks of clients.

fedbandit's matrices are small (d x d per client and arm), and its parallelism is one process per
seed. Multithreaded BLAS on such sizes only adds synchronisation, and on a shared or oversubscribed
machine a threaded call can stall for tens of milliseconds (measured: the design benchmark ran 7x
slower with two BLAS threads while another job used the cores). So the CLI and every worker run
BLAS single-threaded. Library users keep their own setting unless they call this.

The same commands also stop NumPy from advising transparent huge pages for its large arrays
(``small_page_arrays``): with the kernel's ``defrag = madvise`` setting every first touch of a
new large array may compact memory synchronously, and Fed-PE at a million clients allocates
hundreds of MB a phase (measured at M = 10^6: 78 s of system time with the advice, 40 s without,
wall time 220 s against 125 s in back-to-back runs).

fedbandit's own threads are another matter: a compiled kernel that plays whole blocks of clients
for thousands of steps (``BanditEnvironment.play_steps``, Local UCB) is long-running work on
independent clients, and runs on ``kernel_threads()`` threads. Its results do not depend on the
number (each client has its own noise stream; sums across clients are integer-valued fixed point,
exact in any order). The number is, in order: the environment variable ``FEDBANDIT_THREADS``
(a positive integer), the process's setting (``set_kernel_threads``: the runner's worker processes
share the cores among them, a Ray task takes one), else the CPUs this process may run on
(``os.sched_getaffinity``), at most ``MAX_KERNEL_THREADS``.
"""

from __future__ import annotations

import os

import numpy as np
from threadpoolctl import threadpool_limits

from fedbandit.errors import ConfigError

_limits = None
#: Default cap of ``kernel_threads`` (the environment variable may exceed it).
MAX_KERNEL_THREADS = 8
_kernel_threads: int | None = None


def single_threaded_blas() -> None:
    """Limit BLAS (OpenBLAS, MKL, ...) to one thread in this process, once."""
    global _limits
    if _limits is None:
        _limits = threadpool_limits(limits=1, user_api="blas")


def small_page_arrays() -> None:
    """Stop NumPy from advising transparent huge pages (``madvise``) for its large arrays."""
    core = getattr(np, "_core", None) or np.core
    core.multiarray._set_madvise_hugepage(False)


def process_defaults() -> None:
    """What the command line and each process it runs work in: single-threaded BLAS and no
    transparent-huge-page advice for NumPy's arrays (both described above)."""
    single_threaded_blas()
    small_page_arrays()


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def set_kernel_threads(count: int | None) -> None:
    """This process's number of kernel threads (None: back to the default); see the module."""
    global _kernel_threads
    if count is not None and count < 1:
        raise ValueError(f"kernel threads must be >= 1, got {count}")
    _kernel_threads = count


def kernel_threads() -> int:
    """Threads for the compiled kernels over blocks of clients (see the module for the order)."""
    value = os.environ.get("FEDBANDIT_THREADS", "").strip()
    if value:
        try:
            count = int(value)
        except ValueError:
            count = 0
        if count < 1:
            raise ConfigError(f"FEDBANDIT_THREADS must be a positive integer, got {value!r}")
        return count
    if _kernel_threads is not None:
        return _kernel_threads
    return min(available_cpus(), MAX_KERNEL_THREADS)
