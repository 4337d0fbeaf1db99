"""quantkit: quantize MoE targets to MXFP4 and EAGLE-3 drafts to FP8 with AMD Quark, and check them for vLLM."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__: str = version("quantkit")
except PackageNotFoundError:  # running from a source tree that was never pip-installed
    __version__ = "0.1.0"

__all__ = ["__version__"]
