"""Scale values (finite, positive, E8M0 not NaN), read with numpy, and notes for the serving platform."""

from quantkit.rules.platform import fp8_fnuz, mxfp4_emulated  # house-move stub (issue 19): deleted at S3  # noqa: F401
from quantkit.rules.scales import scale_data  # house-move stub (issue 19): deleted at S3  # noqa: F401
