"""The state server: durable window snapshots, job results (the SQLite sink) and
dead letters, served over gRPC (protos/gridstream/v1/stateserver.proto)."""
