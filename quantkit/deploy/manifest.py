"""`deploy.json`: moved to quantkit.deploy.run (the manifest) and quantkit.deploy.env (the platform environment)."""

from quantkit.deploy.env import platform_env  # house-move stub (issue 19): deleted at S3  # noqa: F401
from quantkit.deploy.run import DeployInputError  # house-move stub (issue 19): deleted at S3  # noqa: F401
from quantkit.deploy.run import run as deploy_manifest  # house-move stub (issue 19): deleted at S3  # noqa: F401
from quantkit.results.deploy import (  # house-move stub (issue 19): deleted at S3  # noqa: F401
    DEPLOY_FILE,
    DEPLOY_SCHEMA_VERSION,
    DeployManifest,
    EnvVar,
)
from quantkit.rules.kv_cache import KV_CACHE_DTYPES  # house-move stub (issue 19): deleted at S3  # noqa: F401
from quantkit.rules.table import KNOWN_BAD  # house-move stub (issue 19): deleted at S3  # noqa: F401
from quantkit.vocab import Platform  # house-move stub (issue 19): deleted at S3  # noqa: F401
