"""`python -m tui_trainer.launcher SOCKET`: the warm launcher (launcher/server.py)."""

import sys

from .server import main

sys.exit(main())
