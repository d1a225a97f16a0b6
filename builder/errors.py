"""Errors the builder raises: each names what was wrong, where, and what was expected."""
from __future__ import annotations

from minirt.errors import Error


class BuildError(Error):
    """The model or the build options cannot be turned into an artifact."""


class UnsupportedModel(BuildError):
    """The model uses an operator, attribute or type that minirt cannot run."""
