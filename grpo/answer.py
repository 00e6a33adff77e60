"""``grpo.answer`` is ``grpo.view.answer`` (the page's view-model lives in grpo.view).

The module object itself is installed under this name, so a name patched or read as ``grpo.answer.X`` is the one
``grpo.view.answer`` uses.
"""

import sys

from grpo.view import answer

sys.modules[__name__] = answer
