"""``python -m hxmpi.train``: the training command (``hxmpi.train.command``)."""
from ..cli import run_main  # an uncaught error on one rank ends the job
from .command import PROG, main

run_main(main, PROG)
