"""``grpo.explain`` is ``grpo.view.explain`` (the page's view-model lives in grpo.view).

The module object itself is installed under this name, so a name patched or read as ``grpo.explain.X`` is the one
``grpo.view.explain`` uses.
"""

import sys

from grpo.view import explain

sys.modules[__name__] = explain
