"""CLI subcommands, one module each; each exposes ``register(commands)``, and ``pipeline.cli``
lists them explicitly. Shared argument groups and plan loading live in ``common``."""
