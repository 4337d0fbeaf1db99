"""The scheme registry (torchao's config type -> handler, as data): one `Scheme` record per Quark 0.13 scheme
(quark.py), and for the native ones the quantizers that give Quark's file-to-file bytes without importing Quark
(mxfp4.py, ptpc_fp8.py) with the config.json they write (quark_config.py). Everything that depends on a scheme
(the executor's layout, GPU batching and scale check, apply's size prediction and verification) reads its record;
adding a scheme is adding a record (`register_scheme`). No torch at import: the quantizers import it when they run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantkit.schemes.quark import QUARK_SCHEME_ALIASES as ALIASES
from quantkit.schemes.quark import QUARK_SCHEMES as SCHEMES
from quantkit.schemes.record import Layout, Scheme, UnknownSchemeError

if TYPE_CHECKING:
    import torch

__all__ = [
    "ALIASES",
    "SCHEMES",
    "Layout",
    "Scheme",
    "UnknownSchemeError",
    "expected_layout",
    "native_schemes",
    "quantize_weight",
    "register_scheme",
    "scheme",
]


def scheme(name: str) -> Scheme:
    """The record of scheme `name`; UnknownSchemeError naming the known ones."""
    try:
        return SCHEMES[name]
    except KeyError:
        raise UnknownSchemeError(f"unknown scheme {name!r} (known: {', '.join(SCHEMES)})") from None


def native_schemes() -> tuple[str, ...]:
    """The schemes quantkit quantizes without Quark (byte-identical to Quark's file-to-file path), sorted."""
    return tuple(sorted(n for n, s in SCHEMES.items() if s.native))


def register_scheme(record: Scheme) -> None:
    """Add (or replace) a scheme: the executor, the plan and recipes see it at once."""
    SCHEMES[record.name] = record


def _native(name: str) -> Scheme:
    record = SCHEMES.get(name)
    if record is None or not record.native:
        raise ValueError(f"scheme {name!r}: the native quantizer supports {', '.join(native_schemes())}")
    return record


def quantize_weight(
    weight: torch.Tensor, scheme: str, *, finite_only: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(quantized weight, weight_scale) for `scheme` exactly as Quark 0.13's file-to-file path stores them.

    finite_only=True refuses Inf as well as NaN (found from the per-group/per-channel amax, at no extra pass);
    otherwise Inf is quantized as Quark does it.
    """
    quantize = _native(scheme).quantize
    assert quantize is not None
    return quantize(weight, finite_only=finite_only)


def expected_layout(shape: tuple[int, ...], scheme: str) -> Layout:
    """What a quantized weight of `shape` is stored as: {suffix: (safetensors dtype, shape)}, suffix "" = weight."""
    layout = _native(scheme).layout
    assert layout is not None
    return layout(tuple(shape))
