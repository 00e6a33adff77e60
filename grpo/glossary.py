"""``grpo.glossary`` is ``grpo.view.glossary`` (the page's view-model lives in grpo.view).

The module object itself is installed under this name, so a name patched or read as ``grpo.glossary.X`` is the one
``grpo.view.glossary`` uses.
"""

import sys

from grpo.view import glossary

sys.modules[__name__] = glossary
