"""``python -m convtune``: the command line."""

from .cli import main

if __name__ == "__main__":  # not again in the worker processes that `tune --devices` spawns
    main()
