#!/usr/bin/env python
"""Django's command-line utility for the Gyre platform (``python manage.py help``)."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def main() -> None:
    # platform/ is a source folder, never the package `platform` (the stdlib owns that name).
    sys.path.insert(0, str(ROOT / "platform"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gyre_web.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
