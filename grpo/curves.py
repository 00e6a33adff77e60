"""``grpo.curves`` is ``grpo.view.curves`` (the page's view-model lives in grpo.view).

The module object itself is installed under this name, so a name patched or read as ``grpo.curves.X`` is the one
``grpo.view.curves`` uses.
"""

import sys

from grpo.view import curves

sys.modules[__name__] = curves
