"""Tools beside training: the SimGrid simulator and the emulated multi-host cluster
(``python -m hxmpi.sim.cluster``). Importing this package does not initialise MPI.

The simulator, one job a module: ``simulate`` (``python -m hxmpi.sim``) and ``scale``
(``python -m hxmpi.sim.scale``) are the commands, reading their flags with ``args``; ``sweep``
makes a record per layout and block size; ``calls`` says what one call is and ``schedule`` the
messages of its step program; ``trace`` writes every rank's trace with ``actions`` (and Open MPI's
``reference`` schedules); ``replay`` runs SimGrid (``simgrid``) on a ``platform`` of ``presets``;
``output`` shows the records; ``errors`` holds the simulator's errors.
"""
