"""fencepost server: gRPC servicers over the domain rules over a storage backend."""
