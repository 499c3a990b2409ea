"""Tools around the library: the ``collcomm`` command line, the launcher (``collcomm run``)
and the benchmark (``collcomm bench``)."""
