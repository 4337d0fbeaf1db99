"""`quantkit publish`: a Hub repo with the quantized folder and a generated model card, in one commit."""

from quantkit.publish.card import build_model_card
from quantkit.publish.hub import PublishResult, publish

__all__ = ["PublishResult", "build_model_card", "publish"]
