"""``python -m fp8_linear.cli``: the same as the ``fp8-linear`` command."""

import sys

from . import main

sys.exit(main())
