"""The model: a Llama-family decoder, the paged attention backends, the runner (a step
plan in, sampled tokens out), checkpoints and tokenizers."""
