"""Give a long-running process a name `top`, `ps -o comm` and `perf` show instead of "python"."""

from __future__ import annotations

import ctypes
import sys

_PR_SET_NAME = 15
_MAX_BYTES = 15  # the kernel keeps 15 bytes and a NUL


def set_process_name(name: str) -> bool:
    """Name the calling thread, and so every thread it starts afterwards (Linux; elsewhere a no-op).
    Returns whether the name was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        # The process's own symbols (libc's among them): find_library would run ldconfig in a subprocess.
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_NAME, name.encode()[:_MAX_BYTES], 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
