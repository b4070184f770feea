"""What every CLI command shares: one place that maps library errors to clean exits."""
from __future__ import annotations

import errno
import functools
import signal
import sys
import threading
from pathlib import Path

import click

from ..errors import Cancelled, EdgespecError


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def handle_errors(fn):
    """Turn EdgespecError into `Error: ...` and exit 1 (2 for bad usage); Ctrl-C into exit 130.

    Anything else is a bug and keeps its traceback.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Cancelled:
            click.echo("\ncancelled", err=True)
            sys.exit(130)
        except KeyboardInterrupt:
            if _main_thread():  # the process is exiting: a second Ctrl-C must not kill it
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # mid-shutdown
            click.echo("\ninterrupted", err=True)
            sys.exit(130)
        except EdgespecError as e:
            raise click.ClickException(str(e)) from None
        except OSError as e:
            # a full, read-only or foreign disk is the machine's state, not a bug: one line
            if e.errno not in _DISK_ERRNOS:
                raise
            from ..statefile import explain  # deferred: only on this error path
            raise click.ClickException(explain(e, Path(e.filename or "."), "file")) from None

    return wrapper


_DISK_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EROFS}
