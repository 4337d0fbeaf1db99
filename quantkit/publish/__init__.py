"""`quantkit publish`: a Hub repo with the quantized folder, a generated model card, the acceptance sidecar and chart,
and deploy.json, in one commit; nothing published names a local path."""

from quantkit.publish.card import build_model_card
from quantkit.publish.charts import render_acceptance_chart
from quantkit.publish.hub import PublishResult, publish
from quantkit.publish.sidecar import AcceptanceSidecar

__all__ = ["AcceptanceSidecar", "PublishResult", "build_model_card", "publish", "render_acceptance_chart"]
