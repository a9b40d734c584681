"""BLAS threading policy of the command line and its worker processes.

fedbandit's matrices are small (d x d per client and arm), and its parallelism is one process per
seed. Multithreaded BLAS on such sizes only adds synchronisation, and on a shared or oversubscribed
machine a threaded call can stall for tens of milliseconds (measured: the design benchmark ran 7x
slower with two BLAS threads while another job used the cores). So the CLI and every worker run
BLAS single-threaded. Library users keep their own setting unless they call this.
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits

_limits = None


def single_threaded_blas() -> None:
    """Limit BLAS (OpenBLAS, MKL, ...) to one thread in this process, once."""
    global _limits
    if _limits is None:
        _limits = threadpool_limits(limits=1, user_api="blas")
