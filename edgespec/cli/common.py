"""What every CLI command shares: one place that maps library errors to clean exits."""
from __future__ import annotations

import functools
import sys

import click

from ..errors import Cancelled, EdgespecError


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
            click.echo("\ninterrupted", err=True)
            sys.exit(130)
        except EdgespecError as e:
            raise click.ClickException(str(e)) from None

    return wrapper
