"""BLAS threading policy of the command line and its worker processes.

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
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

_limits = None


def single_threaded_blas() -> None:
    """Limit BLAS (OpenBLAS, MKL, ...) to one thread in this process, once."""
    global _limits
    if _limits is None:
        _limits = threadpool_limits(limits=1, user_api="blas")


def small_page_arrays() -> None:
    """Stop NumPy from advising transparent huge pages (``madvise``) for its large arrays."""
    core = getattr(np, "_core", None) or np.core
    core.multiarray._set_madvise_hugepage(False)
