"""`quantkit check`: prove, before any GPU time is spent, that vLLM will load a Quark checkpoint as intended."""

from quantkit.rules.exclude import exclude_fix  # house-move stub (issue 19): deleted at S3  # noqa: F401
from quantkit.rules.table import RULES, run_rules  # house-move stub (issue 19): deleted at S3  # noqa: F401
