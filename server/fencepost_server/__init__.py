"""fencepost server: gRPC servicers over the domain rules over a storage backend."""

from fencepost._version import __version__

__all__ = ["__version__"]
