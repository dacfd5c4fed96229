"""The ``convtune`` command line: tune, show, explain, export, import, info.

Every error a user can cause ends in a one-line message and a non-zero exit.
"""

from __future__ import annotations

import click

from ..bench.commands import bench, bench_model_cmd, report
from ..commandline import Group
from .cachecmds import backup, calibrate, export_cmd, import_cmd, info
from .tuning import demo, explain, show, tune


@click.group(cls=Group)
@click.version_option(package_name="convtune")
def main():
    """convtune: convolution auto-tuning engine and cached plan service.

    Tune a network once (`convtune tune resnet50`); training code then finds the
    plans in the cache (`convtune.conv`, `convtune.Conv2d`).
    """


for _command in (tune, demo, show, explain, export_cmd, import_cmd, calibrate, backup, info, bench, bench_model_cmd,
                 report):
    main.add_command(_command)
