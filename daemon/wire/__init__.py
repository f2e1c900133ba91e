"""The one conversion between the protobuf messages and the core's records, used by the
daemon, the client library and the dashboard alike."""
