"""CLI subcommands beyond validate/plan/engine; each module exposes ``register(commands)``."""
