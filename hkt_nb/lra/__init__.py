"""The long-range benchmarks and their training (extra `[lra]`): ListOps generation, tokenisation, benchmark loading, configuration, the training loop and runs."""
