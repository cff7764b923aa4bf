"""A pull cut by SIGTERM or SIGINT while its threads are busy ends with one FATAL line, and no traceback.

The download runs on worker threads (singpy.oci.layercache), a large blob is hashed on another
(singpy.oci.blobfetch._HashThread), layers are read ahead (singpy.oci.readahead); the main thread turns the
signal into the FATAL (singpy.image.tools.Interruptible) and cleans up under them. The traceback seen was the
main thread's: the handler ran inside importlib's module lock callback, where Python only prints what is
raised ("Exception ignored in"), and the signal was lost (the pull went on): the sweep below hits that now
and then, the callback tests every time (for any command but the launches, from its dispatch on).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support import oci
from tests.support.oci import busybox_image, file
from tests.support.pulling import cache_env, user_dir
from tests.support.registry import RegistryServer

_SIZE = 24 << 20  # above blobfetch._THREAD_FROM: the blob is hashed on a thread of its own


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("cut", ["stalled-early", "stalled-late", 0.2, 0.3, 0.45, 0.8])
def test_a_pull_cut_by_a_signal_while_threads_work_says_one_fatal(singpy: Singpy, registry_redirect: RegistryServer,
                                                                  workdir: Path, signal_number: int,
                                                                  cut: float | str) -> None:
    name = f"signals-{signal_number}-{cut}"
    layer = oci.Layer([file("big", os.urandom(_SIZE))], compression="none")  # unique: os.urandom
    registry_redirect.upload(busybox_image(layers=[layer]), f"pull/{name}")
    host = registry_redirect.blob_host
    assert host is not None
    env = cache_env(singpy, workdir, name, SINGPY_DOCKER_USERNAME=registry_redirect.username,
                    SINGPY_DOCKER_PASSWORD=registry_redirect.password)
    out = user_dir(singpy, workdir, name) / "cut.sif"
    stalled = cut in ("stalled-early", "stalled-late")
    stall = host.stall(layer.digest, after=(1 << 20) if cut == "stalled-early" else _SIZE - (1 << 20))
    process = singpy.popen(["pull", "--no-https", str(out), registry_redirect.ref(f"pull/{name}")], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if stalled:  # a download worker waits for the next bytes, the hash thread on its queue
            assert stall.reached.wait(60)
        else:  # the download, its hash, the layer's conversion: wherever `cut` seconds fall (no stall)
            stall.release()
            time.sleep(float(cut))
        process.send_signal(signal_number)
        _, err = process.communicate(timeout=60)
    finally:
        threading.Thread(target=stall.release).start()
    assert "Traceback" not in err and "Exception in thread" not in err and "Exception ignored" not in err, err
    fatal = [line for line in err.splitlines() if line.startswith("FATAL:")]
    if process.returncode in (-signal_number, 130) and not stalled:  # cut before the pull began (as Apptainer)
        assert not fatal, err
    elif process.returncode == 0 and not stalled:  # the pull was over: the image is whole
        assert out.exists() and not fatal, err
        return
    else:
        assert process.returncode == 255 and len(fatal) == 1, err
        assert signal.Signals(signal_number).name in fatal[0], err
    assert not out.exists() and os.listdir(out.parent) == []


_IN_A_CALLBACK = """
import os, signal, sys
from singpy.image.tools import Interruptible, Interrupted

class Dropped:
    def __del__(self):  # Python only prints what a __del__ raises ("Exception ignored in")
        os.kill(os.getpid(), signal.%s)
        for _ in range(100000):  # the handler runs here, at a check between bytecodes
            pass

try:
    with Interruptible():
        Dropped()
        for _ in range(10000000):  # the work the signal was meant to end (a pull)
            pass
        print("not interrupted")
except Interrupted as error:
    print(error.message)
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_taken_inside_a_callback_still_interrupts_without_a_traceback(name: str) -> None:
    """The handler raised where Python can only print the exception (seen: importlib's module lock callback
    during a pull's lazy import): the pull must still end with its one FATAL, and no traceback."""
    import sys

    result = subprocess.run([sys.executable, "-c", _IN_A_CALLBACK % name], capture_output=True, text=True,
                            timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert result.stdout == f"interrupted by {name}\n" and result.stderr == "", result


_IN_A_THREAD_START = """
import os, signal, threading
from singpy.image.tools import Interruptible, Interrupted, start_thread

real_start = threading._start_new_thread

def start_then_signal(*args):  # the signal where CI's SIGINT fell: the thread runs, Thread.start not yet over
    ident = real_start(*args)
    os.kill(os.getpid(), signal.%s)
    for _ in range(100000):  # the handler runs here, at a check between bytecodes
        pass
    return ident

threading._start_new_thread = start_then_signal
ran = threading.Event()
try:
    with Interruptible():
        thread = threading.Thread(target=ran.set, daemon=True)
        start_thread(thread)
        for _ in range(10000000):  # the work the signal was meant to end (a pull)
            pass
        print("not interrupted")
except Interrupted as error:
    print(error.message, ran.wait(10))
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_during_a_thread_start_interrupts_once_the_thread_runs(name: str) -> None:
    """CI saw SIGINT cut a pull inside Thread.start: CPython then dropped the new thread from its table and the
    thread died with a traceback ("Exception ignored in thread started by"). The signal waits for the start."""
    import sys

    result = subprocess.run([sys.executable, "-c", _IN_A_THREAD_START % name], capture_output=True, text=True,
                            timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert result.stdout == f"interrupted by {name} True\n" and result.stderr == "", result


_DROPPED = """
import os, signal

class Dropped:
    def __del__(self):  # as importlib's module lock callback: Python only prints what it raises
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100000):  # the default handler's KeyboardInterrupt is raised here
            pass
"""

_BEFORE_INTERRUPTIBLE = _DROPPED + """
from singpy.image.tools import keep_interrupts

keep_interrupts()
try:
    Dropped()
    for _ in range(10000000):  # the start of a pull, before its Interruptible
        pass
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted")
"""


def test_a_ctrl_c_in_a_callback_before_the_pull_is_not_lost() -> None:
    """CI saw SIGINT land in importlib's module lock callback as a pull started: printed, lost, the pull done."""
    import sys

    result = subprocess.run([sys.executable, "-c", _BEFORE_INTERRUPTIBLE], capture_output=True, text=True,
                            timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert result.stdout == "interrupted\n" and result.stderr == "", result


_AS_A_COMMAND_LOADS = _DROPPED + """
import sys
from singpy.cli.main import main

class Finder:  # asked first for every import: the Ctrl-C lands as the command's own module loads
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == %r:
            Dropped()
        return None

sys.meta_path.insert(0, Finder)
sys.exit(main(%r))
"""


@pytest.mark.parametrize(("module", "words"), [
    ("singpy.cli.app", ["cache", "list"]),  # typer's commands (build, cache, instance...)
    ("singpy.cli.fastpull", ["pull", "--help"]),  # pull, before any of its Interruptible blocks
], ids=["cache-list", "pull"])
def test_a_ctrl_c_in_a_callback_as_a_command_starts_ends_it(workdir: Path, module: str, words: list[str]) -> None:
    """Every command but the launches (whose payload takes the terminal's signals) keeps such a Ctrl-C: it ends
    the command with 130, as a Ctrl-C anywhere else does, where it was printed as a traceback and the command
    went on to its end."""
    import sys

    env = {**os.environ, "APPTAINER_CACHEDIR": str(workdir / "cache")}
    result = subprocess.run([sys.executable, "-c", _AS_A_COMMAND_LOADS % (module, words)], capture_output=True,
                            text=True, timeout=120, cwd=Path(__file__).resolve().parents[2], env=env)
    assert (result.returncode, result.stderr) == (130, ""), result
