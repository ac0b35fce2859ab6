"""Tools beside training: the SimGrid simulator (``python -m hxmpi.sim``: ``simulate`` and the message
schedules it replays, ``schedule``) and the emulated multi-host cluster (``python -m hxmpi.sim.cluster``).
Importing this package does not initialise MPI.
"""
