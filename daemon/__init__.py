"""The daemon, in rooms by layer (docs/architecture.md has the map):

- `core/`: the pure core (layout, budget, pool, ledger, admission, the step); standard library only;
- `log/`: the SQLite decision log;
- `config/`: model configs, presets, sizing, the GPU probe, pool memory, the config file;
- `wire/`: the one conversion between protobuf messages and core records;
- `server/`: the gRPC daemon (lifecycle, servicers, sessions, auth, TLS, metrics).

Nothing here imports torch, NVML or textual at import time.
"""
