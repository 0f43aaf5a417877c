"""The REST API: one package per resource (router, schemas, service), shared errors and dependencies.

``api.app:create_app`` builds the app; ``api.app:app`` is the module-level app for uvicorn.
"""
