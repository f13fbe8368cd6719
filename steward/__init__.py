"""Root daemon: socket server, provisioning, stages, journal writing, reaping, cleanup, retirement, recovery."""
