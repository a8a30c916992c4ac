"""Long-running processes carry a name of their own (`top`, `ps -o comm`, `perf`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_named_process_and_the_threads_it_starts_carry_the_name():
    script = (
        "import threading\n"
        "from core.process_name import set_process_name\n"
        "assert set_process_name('omnipost-disp-and-more')\n"
        "names = []\n"
        "def own_name(): names.append(open(f'/proc/self/task/{threading.get_native_id()}/comm').read())\n"
        "t = threading.Thread(target=own_name)\n"
        "t.start(); t.join()\n"
        "print(open('/proc/self/comm').read().strip(), names[0].strip())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)  # noqa: S603
    assert out.stdout.split() == ["omnipost-disp-a", "omnipost-disp-a"]  # cut to the kernel's 15 bytes
