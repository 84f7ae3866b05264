"""Generated gRPC code of the gridstream v1 protocol (see protos/); never edit by hand."""
