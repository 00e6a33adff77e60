"""``grpo.examples`` is ``grpo.view.examples`` (the page's view-model lives in grpo.view).

The module object itself is installed under this name, so a name patched or read as ``grpo.examples.X`` is the one
``grpo.view.examples`` uses.
"""

import sys

from grpo.view import examples

sys.modules[__name__] = examples
