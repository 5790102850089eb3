"""convert/parallel.py: tensors written by several threads give the same file as one thread,
the error reported is the first in task order whatever thread failed first, and nothing
writes to the output once run_tasks has returned."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from convert_testlib import (BARELLM, CONVERT, REPO, TINY_CONFIG, make_checkpoint, run,
                             tiny_tensors)

sys.path.insert(0, os.path.join(REPO, "convert"))
import parallel  # noqa: E402


def test_pwrite_all_writes_blocks_at_their_offsets(tmp_path):
    path = tmp_path / "out"
    blocks = [np.arange(n, dtype=np.float16) + n for n in (5, 1, 300)]
    with open(path, "wb") as f:
        stopping = threading.Event()
        offset = 0
        writers = []
        for block in blocks:
            writers.append((parallel.BlockWriter(f.fileno(), offset, stopping), block))
            offset += block.nbytes
        for writer, block in reversed(writers):  # out of file order
            writer.write(block[: len(block) // 2])
            writer.write(block[len(block) // 2:])
    assert path.read_bytes() == b"".join(block.tobytes() for block in blocks)


def test_the_first_failure_in_task_order_is_raised():
    later_failed = threading.Event()

    def first(_stopping):
        assert later_failed.wait(10)  # fails after the second task has
        raise ValueError("first")

    def second(_stopping):
        later_failed.set()
        raise ValueError("second")

    with pytest.raises(ValueError, match="first"):
        parallel.run_tasks([first, second], workers=2)


def test_a_failure_stops_the_later_tasks_before_run_tasks_returns(tmp_path):
    started, ended = threading.Event(), []

    def endless_writer(stopping):
        with open(tmp_path / "out", "wb") as f:
            writer = parallel.BlockWriter(f.fileno(), 0, stopping)
            started.set()
            try:
                while True:
                    writer.write(np.zeros(16, dtype=np.uint8))
                    time.sleep(0.001)
            finally:
                ended.append(True)

    def failing(_stopping):
        assert started.wait(10)
        raise ValueError("bad tensor")

    with pytest.raises(ValueError, match="bad tensor"):
        parallel.run_tasks([failing, endless_writer], workers=2)
    assert ended == [True]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8", "q4"])
def test_one_core_and_several_write_the_same_file(tmp_path, dtype):
    hf = make_checkpoint(tmp_path / "hf")
    outputs = []
    for cores in (sorted(os.sched_getaffinity(0))[:1], sorted(os.sched_getaffinity(0))):
        out = tmp_path / f"out-{len(cores)}.bin"
        result = subprocess.run(
            ["taskset", "-c", ",".join(map(str, cores)), sys.executable, CONVERT, str(hf), "-o",
             str(out), "--dtype", dtype], capture_output=True, text=True, timeout=120,
            env={**os.environ, "BARELLM": BARELLM})
        assert result.returncode == 0, result.stderr
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


def test_of_two_bad_tensors_the_first_in_model_order_is_named(tmp_path):
    tensors = tiny_tensors(TINY_CONFIG)
    for name in ("model.layers.0.mlp.down_proj.weight", "lm_head.weight"):
        values = tensors[name][1].copy()
        values.flat[3] = np.nan
        tensors[name] = (tensors[name][0], values)
    hf = make_checkpoint(tmp_path / "hf", tensors=tensors)
    for _ in range(3):
        result = run(CONVERT, str(hf), "-o", str(tmp_path / "out.bin"))
        assert result.returncode == 1
        assert "tensor 'model.layers.0.mlp.down_proj.weight' contains NaN" in result.stderr
        assert not (tmp_path / "out.bin").exists()
