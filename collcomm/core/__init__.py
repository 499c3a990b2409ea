"""The core: process groups and their per-group call plans, asynchronous work, and the
runtime (the default world, joining a job). Front ends (the functional API, ``collcomm.MPI``,
``collcomm.torch``, the helpers) call into this layer; it calls the algorithms, which call
the transport. The rendezvous stores sit beside it (:mod:`collcomm.rendezvous`)."""
