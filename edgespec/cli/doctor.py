"""`edgespec doctor`: is the installed llama.cpp built for this machine?"""
from __future__ import annotations

import json

import click

from .common import handle_errors

_MARK = {"ok": "ok  ", "warn": "warn", "error": "FAIL"}


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@handle_errors
def doctor_command(as_json: bool) -> None:
    """Compare what the installed llama.cpp was built with (x86 extensions, AMX, GPU
    backends, RPC) with what this machine offers, and print the command that rebuilds
    llama-cpp-python for it where they disagree. Exits 1 when the build would crash here."""
    from ..runtime import backend  # deferred: it loads llama.cpp
    from ..runtime.llama_build import Host, diagnose  # deferred: `edgespec` starts without what other commands need

    build, host = backend.build_facts(), Host.local()
    d = diagnose(build, host)
    if as_json:
        click.echo(json.dumps({"llama_cpp_python": build.llama_cpp_python,
                               "system_info": build.system_info, "devices": list(build.devices),
                               "cpu": host.cpu, "host_accelerators": list(host.accelerators),
                               **d.to_json()}, indent=2))
    else:
        click.echo(f"llama-cpp-python {build.llama_cpp_python} on {host.cpu}")
        click.echo(f"  llama.cpp: {build.system_info}")
        for f in d.findings:
            click.echo(f"  {_MARK[f.level]}  {f.topic:<11} {f.detail}")
        if d.rebuild:
            click.echo("rebuild llama-cpp-python for this machine with:")
            click.echo(f"  {d.rebuild}")
        else:
            click.echo("the build matches this machine")
    if d.worst == "error":
        raise SystemExit(1)
