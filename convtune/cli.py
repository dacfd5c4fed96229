"""The ``convtune`` command line."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="convtune")
def main():
    """convtune: convolution auto-tuning engine and cached plan service."""


@main.command()
def info():
    """This machine's fingerprint, backends and strategies."""
    from .backend import get_backend, gpu_available
    from .strategies import all_strategies
    backends = ["numpy"] + (["cupy"] if gpu_available() else [])
    for name in backends:
        click.echo(f"{name}: {get_backend(name).device_info().key()}")
    click.echo("strategies: " + ", ".join(s.name for s in all_strategies(True)))
