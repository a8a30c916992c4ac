"""N real dispatcher processes for the price of one Python and Django start-up: Django is set up
and the dispatcher imported once, then N children are forked (no session or thread exists yet),
each running `manage.py run_dispatcher` with its own sessions, as N separate starts would.

    python -m tests.queueing.fork_dispatchers N manage.py run_dispatcher [options]

Exits 0 when every child does; SIGTERM and SIGINT are passed on to the children. The command line
names `manage.py run_dispatcher`, so a test's teardown finds a stray one (tests.support.workers).
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> int:
    count, command = int(sys.argv[1]), sys.argv[2:]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings_test")
    import django

    django.setup()
    from django.core.management import execute_from_command_line

    import dispatch.management.commands.run_dispatcher  # noqa: F401 - imported once, before the forks

    children = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                execute_from_command_line(command)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            finally:
                os._exit(code)
        children.append(pid)

    def relay(signum: int, _frame: object) -> None:
        for child in children:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, relay)
    signal.signal(signal.SIGINT, relay)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    return 0 if codes == [0] * count else 1


if __name__ == "__main__":
    sys.exit(main())
