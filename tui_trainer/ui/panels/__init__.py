"""The dashboard's panels, one module each. A panel draws what a `Tick` holds
(`draw(tick)`, common.py), owns its keys and dialogs, and tells the app what the user asked
for with typed messages; none of them touches the session store (writes go through
`app.write`, in a worker thread).

The tabs, in order: a new tab is a module with a panel class (TAB, TITLE, PANEL_ID, draw)
and one line here. The first is mounted with the screen, the others when first shown.
"""

from .ab import ABPanel
from .compare import ComparePanel
from .divergence import DivergencePanel
from .log import LogPanel
from .model import ModelPanel
from .plots import PlotsPanel
from .profile import ProfilePanel

TAB_PANELS = (PlotsPanel, DivergencePanel, ComparePanel, ABPanel, ProfilePanel, ModelPanel,
              LogPanel)
