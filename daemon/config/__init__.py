"""Model and host configuration: HF configs and presets, sizing, the GPU probe, pool memory,
and the daemon's config file."""
