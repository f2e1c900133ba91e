"""The gRPC daemon: lifecycle, servicers, sessions and leases, auth, TLS, metrics.

Only the daemon command (`kvbudget.cli.cmd_daemon`) imports this room.
"""
