"""``grpo.experiments`` is ``grpo.view.experiments`` (the page's view-model lives in grpo.view).

The module object itself is installed under this name, so a name patched or read as ``grpo.experiments.X`` is the one
``grpo.view.experiments`` uses.
"""

import sys

from grpo.view import experiments

sys.modules[__name__] = experiments
