"""Writing the tensors of one output file on every core.

A tensor is converted (or generated) one row block at a time, and each block is written at
its own offset in the output with os.pwrite, so tensors need not be written in file order:
several threads each take a tensor. numpy's conversions, quantization and random number
generation and the writes themselves release the GIL, so the threads run on as many cores
as the process may use (on 2 cores a checkpoint converts in about half the one-thread
time).
"""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np


class Stopped(Exception):
    """Raised in a worker between blocks once another tensor has failed."""


def cores():
    """The number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def pwrite_all(fd, data, offset):
    """Write all of `data` (bytes-like) at `offset` of the open file `fd`."""
    view = memoryview(data).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


class BlockWriter:
    """Writes consecutive blocks from a starting offset of an open file; raises Stopped
    once the run it belongs to is stopping."""

    def __init__(self, fd, offset, stopping):
        self.fd, self.offset, self._stopping = fd, offset, stopping

    def write(self, array):
        """Write a numpy array's bytes at the current offset and move past them."""
        if self._stopping.is_set():
            raise Stopped()
        pwrite_all(self.fd, np.ascontiguousarray(array), self.offset)
        self.offset += array.nbytes


def run_tasks(tasks, workers=None):
    """Run `tasks` (callables taking a threading.Event that is set once the run is
    stopping) on `workers` threads (default: one per core).

    Tasks are waited for in list order and the first one that raised has its exception
    raised here, whatever order the threads finished in, so that the error reported is the
    same from run to run. Then (or when this thread is interrupted by a stop signal) the
    tasks not started are cancelled and the running ones end at their next block
    (BlockWriter.write raises Stopped) before this returns: nothing writes to the output
    after that."""
    stopping = threading.Event()
    with ThreadPoolExecutor(max_workers=workers or cores()) as pool:
        futures = []
        try:
            for task in tasks:
                futures.append(pool.submit(task, stopping))
            for future in futures:
                future.result()
        except BaseException:
            stopping.set()
            for future in futures:
                future.cancel()
            raise
