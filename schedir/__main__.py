"""`python -m schedir` runs the command line."""

import sys

from schedir.tools.cli import main

sys.exit(main())
