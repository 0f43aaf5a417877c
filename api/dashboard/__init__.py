"""The dashboard: a static single-page app at ``/`` that reads the public REST API."""

from api.dashboard.router import install

__all__ = ["install"]
