"""The `edgespec` command: a thin click adapter over the engine's event stream."""
from __future__ import annotations

import click

from .._version import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgespec")
def cli() -> None:
    """Lossless speculative decoding for GGUF models on llama.cpp: the same answer as plain
    decoding, faster where the output repeats its input (code edits, extraction, summaries)."""
    from .feedback import install  # one-line warnings, first-run progress (edgespec.cli.feedback)

    install()


# --- subcommands: each lives in its own module, registered here explicitly ---
# (helpers: add one import + add_command line per command group below)
from .generate import generate  # noqa: E402

cli.add_command(generate)
from .models import models  # noqa: E402

cli.add_command(models)
from .tui import tui_command  # noqa: E402

cli.add_command(tui_command)
from .plan import plan_command  # noqa: E402

cli.add_command(plan_command)
from .parity import parity  # noqa: E402

cli.add_command(parity)
from .bench import bench, qualify  # noqa: E402

cli.add_command(bench)
cli.add_command(qualify)
from .chat import chat  # noqa: E402

cli.add_command(chat)
from .identity import identity_command  # noqa: E402

cli.add_command(identity_command)
from .attribute import attribute_command  # noqa: E402

cli.add_command(attribute_command)
from .export import export_command  # noqa: E402

cli.add_command(export_command)
from .serve import serve  # noqa: E402

cli.add_command(serve)
from .rpc_server import rpc_server  # noqa: E402

cli.add_command(rpc_server)
from .doctor import doctor_command  # noqa: E402

cli.add_command(doctor_command)
from .self_draft import self_draft_command  # noqa: E402

cli.add_command(self_draft_command)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
