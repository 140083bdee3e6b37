"""The ``gyre`` command."""
