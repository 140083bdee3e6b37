"""Training: tiny Qwen3 models built from configs, and the tree-attention policy-gradient loss."""
