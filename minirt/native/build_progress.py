"""Progress of the native kernels' compile during ``pip install`` (setup.py's ``build_ext``).

pip runs the build in a subprocess and shows its output only with ``-v``, so a source install sat
silent for the minutes one C file takes to compile (a Raspberry Pi: several).  The build writes a
few lines to the user's terminal instead (``/dev/tty``, which pip does not capture): what it is
doing, a line every ``every`` seconds while the compiler runs, and the time it took.  Without a
terminal (CI, a piped install) it writes nothing.  Plain Python with no imports from minirt: setup.py
loads this file before the package exists.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import IO, Iterator

MESSAGE = ("minirt: compiling the native kernels (one C file: about 1-2 minutes on a desktop, several on a "
           "Raspberry Pi; `pip install -v` shows the compiler)")


def open_terminal() -> IO[str] | None:
    """The controlling terminal for writing, or None when there is none."""
    try:
        return open("/dev/tty", "w", encoding="utf-8")  # noqa: SIM115 - closed by reporting()
    except OSError:
        return None


@contextlib.contextmanager
def reporting(stream: IO[str] | None, every: float = 15.0, clock=time.monotonic) -> Iterator[None]:
    """Around a long step: MESSAGE, then "still compiling (N s)" every ``every`` seconds from a
    background thread, then "done in N s" (or "failed after N s") on ``stream``; nothing when
    ``stream`` is None.  Write errors (a terminal that went away) never fail the build."""
    if stream is None:
        yield
        return

    def say(text: str) -> None:
        try:
            stream.write(text + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass

    start = clock()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            say(f"minirt: still compiling ({clock() - start:.0f} s)")

    say(MESSAGE)
    thread = threading.Thread(target=beat, name="minirt-build-progress", daemon=True)
    thread.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        thread.join()
        say(f"minirt: native kernels {'done in' if ok else 'failed after'} {clock() - start:.0f} s")
        with contextlib.suppress(OSError, ValueError):
            stream.close()
