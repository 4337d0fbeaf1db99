"""The record every scheme of the registry is, and the error every native quantizer raises: a leaf module, so that the
registry (quantkit.schemes) can import the scheme modules that import these."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scheme:
    """What one Quark 0.13 scheme stores. `static_activation_scales` means a calibrated input_scale per layer (so it
    needs calibration data and Quark's in-memory path)."""

    name: str  # Quark's scheme name (template.py QuantizationSchemeCollection)
    weights: str  # label, e.g. "MXFP4 (E8M0 scale per 32)"
    activations: str  # label, e.g. "MXFP4, dynamic"
    static_activation_scales: bool = False


class NonFiniteWeight(ValueError):
    """The weight holds NaN (always refused) or Inf (refused when finite_only=True)."""
