"""``python -m fedbandit.cli``: the ``fedbandit`` command."""

import sys

from fedbandit.cli import main

sys.exit(main())
