"""The evaluate stage's parts: prompts, candidate methods, one shared prefill per prompt, the
measurement through the reference runtime, and the cost model's GPU predictions per candidate."""
