"""``python -m qwen_resnorm_fp4 info | demo | bench ...`` (:mod:`.cli`)."""

import sys

from .cli import main

sys.exit(main())
