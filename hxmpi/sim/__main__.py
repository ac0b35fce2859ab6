"""``python -m hxmpi.sim``: the simulator's command (``hxmpi.sim.simulate``)."""
import sys

from .simulate import main

sys.exit(main())
