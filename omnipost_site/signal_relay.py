"""A stop signal reaches the main thread of a granian worker, whichever thread the kernel gave it to.

Granian's WSGI worker waits for its stop in the main thread, on a lock (`evp.wait()` in
granian.server.mp), and only a Python signal handler sets that lock free. CPython runs handlers in
the main thread alone, which a blocked lock wait notices only when the signal interrupts that very
thread (EINTR). A process-directed SIGTERM goes to any thread that does not block it: the worker's
Rust runtime and blocking threads, or ours (the ringer, the key cache's listener). Given to one of
those, the handler is left pending until the main thread runs Python again, which it never does:
the worker serves on, and its server waits for it forever (1 stop in 30 of `run_all` here; the
symptom of emmett-framework/granian#875). `tests/ops/test_signal_relay.py` sends the signal to a
worker's other thread and shows it stops.

`install` (in the worker's main thread, as the WSGI module is imported) points CPython's wakeup fd
at a pipe: its C-level handler writes each signal's number there on whatever thread it runs. A
daemon thread reads the pipe and sends the first SIGTERM and the first SIGINT once more, to the
main thread itself (`pthread_kill`), which then runs the handler. Once each: the relayed signal
writes its number again, and a handler run twice only sets granian's stop event twice.
"""

from __future__ import annotations

import os
import signal
import threading

_RELAYED = (signal.SIGTERM, signal.SIGINT)


def install() -> bool:
    """Relay stop signals to the main thread; whether it was installed (only from the main thread,
    and only where nothing else has taken the wakeup fd)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    if previous != -1:  # someone else's: give it back
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
        return False
    main = threading.main_thread().ident
    threading.Thread(target=_relay, args=(read, main), name="signal-relay", daemon=True).start()
    return True


def _relay(read: int, main: int) -> None:
    pending = set(_RELAYED)
    while pending:
        try:
            data = os.read(read, 64)
        except OSError:
            return
        if not data:
            return
        for number in data:
            if number in pending:
                pending.discard(number)
                try:
                    signal.pthread_kill(main, number)
                except (ProcessLookupError, OSError):  # the main thread is gone: nothing left to stop
                    return
