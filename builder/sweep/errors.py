"""The errors of ``minirt sweep``: each names what was wrong, where (config file and key) and what was expected.

They are :class:`minirt.Error` subclasses, so the command line prints ``minirt sweep: error: <message>``
and exits with status 2 instead of a traceback.
"""
from __future__ import annotations

from minirt.errors import Error


class SweepError(Error):
    """A sweep cannot run: a missing extra (Ray), a cluster that cannot be reached, a broken cache."""


class ConfigError(SweepError):
    """The sweep configuration is wrong: ``where`` is ``FILE: key.path`` (e.g. ``sweep.toml: models[1].eval``)."""

    def __init__(self, where: str, message: str):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)
