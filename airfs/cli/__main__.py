"""``python -m airfs.cli``: the ``airfs`` command."""

import sys

from airfs.cli.app import main

sys.exit(main())
