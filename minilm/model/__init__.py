"""The model and its execution: a Llama-family decoder over one ragged batch, the paged
attention backends, the runner that turns a step plan into tensors and sampled tokens,
checkpoints and tokenizers."""
