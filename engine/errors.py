"""Errors the engine reports by name (the studio classifies its child's exit by these)."""


class ModelLoadError(Exception):
    """A model file or directory cannot be loaded; the message names what is wrong."""


class UnsupportedError(ModelLoadError):
    """An architecture, tensor type or setting the engine does not cover."""
