"""The exchange engine: ``HierComm`` (``exchange``) and what it is built from.

``topology`` splits the world into node and lane communicators; ``derived`` checks the arguments
of the communicators a HierComm makes (``Split``, ``Create_cart``, ...) and the nodes they
inherit; ``msgspec`` parses mpi4py buffer specs; ``plan`` plans the hierarchical exchange and Bruck rounds (pure, no MPI); ``agreement`` and
``plancache`` agree on a call and cache its plan; ``runs`` binds plans to buffers; ``transfer``
and ``bruck`` move bytes on one communicator; ``costmodel`` prices every algorithm for "auto".
Importing this package does not initialise MPI.
"""
