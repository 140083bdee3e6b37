"""Tokenizers and model checkpoints built locally, without a model hub."""
