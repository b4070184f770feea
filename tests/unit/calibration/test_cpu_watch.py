"""CpuWatch tells others' CPU time from this process's own, children included: the bench
runs llama.cpp's tools as child processes, and their work is the run's, not a busy
machine's (a quiet run was reported busy in 27 of 30 units before)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from edgespec.calibration.cpu import CpuWatch

SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_a_child_this_process_waits_for_is_its_own_work():
    w = CpuWatch()
    subprocess.run([sys.executable, "-c", SPIN.format(s=1.0)], check=True)
    # about 1 CPU-second of the child's over ~1 s: counted as others it would be >= 1/cores
    assert w.share() < 0.2


def test_a_process_it_does_not_wait_for_is_someone_elses():
    w = CpuWatch()
    other = subprocess.Popen([sys.executable, "-c", SPIN.format(s=1.0)])
    try:
        time.sleep(1.2)  # the spinner's CPU time accrues while this process sleeps
        share = w.share()
    finally:
        other.wait()
    assert share > 0.5 / (os.cpu_count() or 1)
