"""``python -m convtune``: the command line."""

from .cli import main

main()
