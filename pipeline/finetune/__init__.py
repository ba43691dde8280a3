"""LoRA fine-tunes of a base model with PEFT on CPU: data the project derives itself, and the trainer."""
