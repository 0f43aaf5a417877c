"""The shared database package: models, the job state machine, sessions. Imports no web or torch code.

The package itself imports nothing, so a client can read the lifecycle (``store.status``) without
loading SQLAlchemy."""
