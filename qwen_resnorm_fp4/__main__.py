"""``python -m qwen_resnorm_fp4 info | demo | bench``."""

import sys

from .cli import main

sys.exit(main())
