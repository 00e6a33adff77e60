"""``grpo.pooling`` is ``grpo.view.pooling`` (the page's view-model lives in grpo.view).

The module object itself is installed under this name, so a name patched or read as ``grpo.pooling.X`` is the one
``grpo.view.pooling`` uses.
"""

import sys

from grpo.view import pooling

sys.modules[__name__] = pooling
