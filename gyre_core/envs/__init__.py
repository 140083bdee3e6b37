"""Task environments for agent RL: in-memory, deterministic, text-in/text-out."""
