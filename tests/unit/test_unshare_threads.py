"""kernel.syscalls.unshare: a user namespace for a process whose other threads are still leaving.

The kernel refuses CLONE_NEWUSER to a threaded process (EINVAL). A pull's threads (downloads, the deadline timer
of a connection) have returned by the time a build or a launch unshares, but under load one may still be in the
kernel for a moment: unshare waits for it (bounded) and tries once more.
"""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import threading, time
from singpy.kernel import syscalls
thread = threading.Thread(target=time.sleep, args=(0.3,))  # still running when unshare is first tried
thread.start()
syscalls.unshare(syscalls.CLONE_NEWUSER | syscalls.CLONE_NEWNS)
print(len(__import__("os").listdir("/proc/self/task")), "thread(s) at unshare's return")
"""


def test_unshare_waits_for_a_thread_that_is_ending() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "1 thread(s) at unshare's return\n"
