"""``python -m minirt``: the same as the ``minirt`` command."""
import sys

from minirt.cli import main

sys.exit(main())
