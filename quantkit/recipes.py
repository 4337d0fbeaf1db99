"""Quantization recipes: the YAML schema, its rules, and loading built-in or user recipe files."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from quantkit.errors import RecipeError
from quantkit.io.files import require_regular_file
from quantkit.io.paths import recipes_dir
from quantkit.io.schema import Wording, describe_all
from quantkit.io.yamlio import load_yaml
from quantkit.schemes import ALIASES, SCHEMES, Scheme
from quantkit.vocab import EAGLE3_DRAFT, MOE_TARGET, ModelKind

# --- data: what recipes may name ------------------------------------------------------------------------------

TargetKind = ModelKind
QuantPath = Literal["auto", "in-memory", "per-shard"]
TARGET_KINDS: tuple[str, ...] = get_args(TargetKind)


@dataclass(frozen=True)
class RoleInfo:
    """A semantic layer group; later code maps it per architecture to checkpoint and vLLM runtime names."""

    description: str
    applies_to: tuple[str, ...] = TARGET_KINDS


ROLES: dict[str, RoleInfo] = {
    "fc": RoleInfo("EAGLE-3 draft input projection (3 target hidden states -> hidden size)", (EAGLE3_DRAFT,)),
    "lm_head": RoleInfo("output projection to the vocabulary"),
    "embed_tokens": RoleInfo("token embedding"),
    "attention": RoleInfo("attention projections, incl. MLA q_a/q_b/kv_a/kv_b/o"),
    "linear_attention": RoleInfo("linear-attention projections of hybrid models (Qwen3-Next / Qwen3.5 Gated DeltaNet)"),
    "indexer": RoleInfo("sparse-attention indexer projections (DeepSeek-V3.2 lightning indexer)"),
    # an MoE-layer EAGLE-3 draft (SpecForge Qwen3MoEForCausalLMEagle3, GptOssForCausalLMEagle3) has both
    "router": RoleInfo("MoE gate and e_score_correction_bias", (MOE_TARGET, EAGLE3_DRAFT)),
    "experts": RoleInfo("routed MoE experts", (MOE_TARGET, EAGLE3_DRAFT)),
    "shared_experts": RoleInfo("MoE shared experts", (MOE_TARGET,)),
    "dense_mlp": RoleInfo("MLP of dense (non-MoE) layers"),
    "decoder_linears": RoleInfo("every linear layer in the decoder layers"),
}


CALIBRATION_EXAMPLE = "calibration: {samples: 128, seq_len: 512}"
NAME_PATTERN = re.compile(r"[a-z0-9-]+")

# --- schema -----------------------------------------------------------------------------------------------------


def _custom(kind: str, message: str, **ctx: Any) -> PydanticCustomError:
    # The message is pre-formatted; a `key` in ctx names the recipe key of a cross-field rule (its loc is empty).
    # pydantic_core only substitutes `{<ctx key>}` placeholders, so braces in the message itself are safe.
    return PydanticCustomError(f"quantkit_{kind}", message, ctx or None)


def _close(value: str, options: list[str]) -> str:
    # A known name that prefixes the value (fp8_e4m3 -> fp8) is a better guess than edit distance alone.
    prefixed = sorted((o for o in options if value.startswith(o)), key=len, reverse=True)
    match = prefixed[:1] or difflib.get_close_matches(value, options, n=1, cutoff=0.6)
    return f"did you mean {match[0]!r}?" if match else "use one of them"


def _check_scheme(value: str) -> str:
    if value in SCHEMES:
        return value
    known = ", ".join(SCHEMES)
    fix = (
        f"use {ALIASES[value]!r}, the current name of this legacy alias"
        if value in ALIASES
        else _close(value, list(SCHEMES))
    )
    raise _custom("scheme", f"unknown Quark scheme {value!r} (known: {known}); {fix}")


def _check_role(value: str) -> str:
    if value in ROLES:
        return value
    raise _custom("role", f"unknown role {value!r} (known: {', '.join(ROLES)}); {_close(value, list(ROLES))}")


def _check_reason(value: str) -> str:
    if not value.strip():
        raise _custom("reason", "empty reason; say why, so that the next person knows whether it still holds")
    return value


RoleName = Annotated[str, AfterValidator(_check_role)]
SchemeName = Annotated[str, AfterValidator(_check_scheme)]
Reason = Annotated[str, AfterValidator(_check_reason)]


class _Strict(BaseModel):
    # strict: YAML `samples: "128"` is a mistake worth reporting, not something to coerce.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class LayerSelector(_Strict):
    """Selects layers by semantic role or by an fnmatch pattern on checkpoint module names (exactly one)."""

    role: RoleName | None = None
    pattern: str | None = None

    @field_validator("pattern")
    @classmethod
    def validate_pattern(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise _custom("pattern", "empty pattern; give an fnmatch pattern such as '*.mlp.gate'")
        return v

    @model_validator(mode="after")
    def validate_one_selector(self) -> LayerSelector:
        if (self.role is None) == (self.pattern is None):
            raise _custom("selector", "give exactly one of 'role' or 'pattern'")
        return self

    @property
    def label(self) -> str:
        """`role` or `pattern <glob>`, for tables and messages."""
        return self.role if self.role is not None else f"pattern {self.pattern}"

    def selects(self, name: str) -> bool:
        """Whether this selector's role is `name`, or its pattern matches `name` as a checkpoint module name."""
        return self.role == name if self.role is not None else fnmatchcase(name, self.pattern or "")


class KeepEntry(LayerSelector):
    """Layers kept in high precision (BF16), and why."""

    reason: Reason


class Override(LayerSelector):
    """Layers quantized with a scheme other than the recipe's global one, and why."""

    scheme: SchemeName
    reason: Reason


class Calibration(_Strict):
    """Calibration data size, needed by schemes with static activation scales."""

    samples: int = Field(gt=0)
    seq_len: int = Field(gt=0)


class Recipe(_Strict):
    """A quantization recipe: which layers get which Quark scheme, which stay BF16 and why.

    Layers in `quantize` roles get `scheme`; layers an override selects get its scheme; layers in `keep` stay
    BF16 whatever else selects them.
    """

    name: str
    description: str
    applies_to: TargetKind
    scheme: SchemeName
    quantize: list[RoleName] | None = None  # None: every linear layer not in `keep`
    keep: list[KeepEntry]
    overrides: list[Override] = []
    path: QuantPath = "auto"
    calibration: Calibration | None = None
    # Multi-token-prediction layers (DeepSeek num_nextn_predict_layers, MiniMax num_mtp_modules): vLLM never loads
    # them into the target, only its MTP draft does. keep: written BF16 (MTP speculation stays possible); drop: left
    # out, and the output config says it has none.
    mtp: Literal["keep", "drop"] = "keep"

    _source: Path | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def validate_name(cls, v: str) -> str:
        if not NAME_PATTERN.fullmatch(v):
            raise _custom("name", f"invalid name {v!r}; use lowercase letters, digits and '-'")
        return v

    @field_validator("description")
    @classmethod
    def validate_description(cls, v: str) -> str:
        if not v.strip() or "\n" in v.strip():
            raise _custom("description", "must be one non-empty line; put details in the reasons")
        return v.strip()

    @field_validator("quantize")
    @classmethod
    def validate_quantize(cls, v: list[str] | None) -> list[str] | None:
        if v == []:
            raise _custom("quantize", "empty list quantizes nothing; omit it to quantize every linear not in keep")
        return v

    @field_validator("calibration", mode="before")
    @classmethod
    def validate_calibration(cls, v: Any) -> Any:
        if v is None or v == "none":
            return None
        if not isinstance(v, dict):
            raise _custom("calibration", f"expected 'none' or a mapping like {{samples: 128, seq_len: 512}}, got {v!r}")
        return v

    @model_validator(mode="after")
    def validate_rules(self) -> Recipe:
        problems = self._rule_violations()
        if problems:
            key, message = problems[0]
            more = len(problems) - 1
            message += f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
            raise _custom("rule", message, key=key)
        return self

    def _rule_violations(self) -> list[tuple[str, str]]:
        """Cross-field rules, each as (key path, message); the first one is reported."""
        problems: list[tuple[str, str]] = []
        static = [("scheme", self.scheme)] if self.scheme_facts.static_activation_scales else []
        static += [
            (f"overrides[{i}].scheme", o.scheme)
            for i, o in enumerate(self.overrides)
            if SCHEMES[o.scheme].static_activation_scales
        ]
        if static and self.path == "per-shard":
            where, scheme = static[0]
            problems.append(
                (
                    "path",
                    f"per-shard cannot be used with {where} {scheme!r}, which has static activation scales "
                    "(Quark's per-shard path drops input_scale); use 'path: in-memory' or a dynamic-activation "
                    "scheme such as ptpc_fp8",
                )
            )
        if static and self.calibration is None:
            where, scheme = static[0]
            problems.append(
                (
                    "calibration",
                    f"{where} {scheme!r} has static activation scales and needs calibration data; "
                    f"add '{CALIBRATION_EXAMPLE}' or use a dynamic-activation scheme such as ptpc_fp8",
                )
            )
        if self.applies_to == EAGLE3_DRAFT and not any(k.selects("lm_head") for k in self.keep):
            problems.append(
                (
                    "keep",
                    "an eagle3-draft recipe must keep lm_head in high precision (vLLM cannot load a quantized "
                    "EAGLE-3 draft lm_head); add '- role: lm_head' with a reason",
                )
            )
        placed_roles = [(f"quantize[{i}]", role) for i, role in enumerate(self.quantize or [])]
        placed_roles += [(f"keep[{i}].role", k.role) for i, k in enumerate(self.keep) if k.role is not None]
        placed_roles += [(f"overrides[{i}].role", o.role) for i, o in enumerate(self.overrides) if o.role is not None]
        for key, role in placed_roles:
            if self.applies_to not in ROLES[role].applies_to:
                problems.append(
                    (
                        key,
                        f"role {role!r} does not exist in {self.applies_to} models "
                        f"(only in {', '.join(ROLES[role].applies_to)}); remove it or fix applies_to",
                    )
                )
        kept_roles = {k.role for k in self.keep if k.role is not None}
        for i, o in enumerate(self.overrides):
            if o.role in kept_roles:
                problems.append(
                    (
                        f"overrides[{i}].role",
                        f"{o.role!r} is also in keep; a layer group is either kept or overridden, remove one",
                    )
                )
        for i, role in enumerate(self.quantize or []):
            if role in kept_roles:
                problems.append(
                    (
                        f"quantize[{i}]",
                        f"{role!r} is also in keep; a layer group is either kept or quantized, remove one",
                    )
                )
        return problems

    @property
    def source(self) -> Path | None:
        """The file this recipe was loaded from (None when built in code)."""
        return self._source

    @property
    def scheme_facts(self) -> Scheme:
        """Facts about the global scheme."""
        return SCHEMES[self.scheme]

    @property
    def needs_calibration(self) -> bool:
        """Whether the global scheme or an override stores calibrated activation scales."""
        schemes = [self.scheme, *(o.scheme for o in self.overrides)]
        return any(SCHEMES[s].static_activation_scales for s in schemes)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as plain data, in the YAML layout (loading it back gives an equal recipe)."""
        data = self.model_dump(mode="json")
        for entry in (*data["keep"], *data["overrides"]):
            for selector in ("role", "pattern"):
                if entry[selector] is None:
                    del entry[selector]
        if self.calibration is None:
            data["calibration"] = "none"  # as written in YAML; `calibration: null` would read the same
        return data


# --- loading ----------------------------------------------------------------------------------------------------


def builtin_recipe_names() -> list[str]:
    """Names of the built-in recipes (file stems in recipes_dir())."""
    folder = recipes_dir()
    if not folder.is_dir():
        raise RecipeError(
            f"built-in recipes folder {folder} not found; set QUANTKIT_RECIPES_DIR or install quantkit from a "
            "source checkout (pip install -e .)"
        )
    return sorted(p.stem for p in folder.glob("*.yaml"))


def _looks_like_path(name_or_path: str | Path) -> bool:
    if isinstance(name_or_path, Path):
        return True
    return (
        "/" in name_or_path
        or os.sep in name_or_path
        or name_or_path.endswith((".yaml", ".yml"))
        or Path(name_or_path).is_file()
    )


def load_recipe(name_or_path: str | Path) -> Recipe:
    """Load a built-in recipe by name, or a user recipe from a YAML file path."""
    if _looks_like_path(name_or_path):
        return load_recipe_file(Path(name_or_path))
    names = builtin_recipe_names()
    if name_or_path not in names:
        raise RecipeError(
            f"unknown recipe {name_or_path!r} (available: {', '.join(names) or 'none'}); "
            "give one of these or a path to a .yaml file"
        )
    path = recipes_dir() / f"{name_or_path}.yaml"
    recipe = load_recipe_file(path)
    if recipe.name != path.stem:
        # Built-ins are found by file name, so a different `name` inside would make `show` and `list` disagree.
        raise RecipeError(f"recipe {path}: name: {recipe.name!r} differs from the file name; rename one of them")
    return recipe


def list_recipes() -> list[Recipe]:
    """All built-in recipes, sorted by name."""
    return [load_recipe(name) for name in builtin_recipe_names()]


def load_recipe_file(path: Path) -> Recipe:
    """Parse and validate one recipe file; every problem becomes a one-line RecipeError naming the file."""
    require_regular_file(path, "recipe", "give a .yaml file", RecipeError)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(
            f"recipe file {path} not found; check the path, or use a built-in recipe name "
            f"({', '.join(_safe_builtin_names()) or 'none available'})"
        ) from None
    except IsADirectoryError:
        raise RecipeError(f"recipe {path}: is a folder; give a .yaml file") from None
    except UnicodeDecodeError:
        raise RecipeError(f"recipe {path}: not UTF-8 text; save it as UTF-8 YAML") from None
    except PermissionError:
        raise RecipeError(f"recipe {path}: permission denied; make the file readable") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        raise RecipeError(f"recipe {path}: {_describe_yaml_error(e)}") from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise RecipeError(
            f"recipe {path}: expected a mapping of keys ({', '.join(Recipe.model_fields)}), got {got}; "
            f"see {recipes_dir() / 'fp8-draft.yaml'} for an example"
        )
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as e:
        raise RecipeError(f"recipe {path}: {describe_all(e, wording=_WORDING)}") from None
    recipe._source = path
    return recipe


def _safe_builtin_names() -> list[str]:
    try:
        return builtin_recipe_names()
    except RecipeError:
        return []


def _describe_yaml_error(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    fix = (
        "merge the two entries"
        if problem.startswith("duplicate key")
        else "fix the value"
        if problem.startswith(("an integer of", "cannot read this value"))
        else "fix the YAML syntax"
    )
    return f"invalid YAML{where}: {problem}; {fix}"


# --- pydantic errors in the recipe's words (quantkit.io.schema writes the line) -----------------------------------

_MISSING_FIXES: dict[str, str] = {
    "name": "add 'name: <lowercase-with-dashes>'",
    "description": "add a one-line 'description'",
    "applies_to": f"add 'applies_to: <{' | '.join(TARGET_KINDS)}>'",
    "scheme": "add 'scheme: <Quark scheme>', e.g. ptpc_fp8 or mxfp4",
    "keep": "add 'keep: []', or list the layers kept in BF16 with a reason each",
    "reason": "say why, so that the next person knows whether it still holds",
    "samples": "add the number of calibration samples",
    "seq_len": "add the calibration sequence length",
}


# Recipe errors explain against the Recipe model: the allowed keys and values, the fix for a missing field.
_WORDING = Wording(
    messages="short", values="python", missing="missing required field", model=Recipe, fixes=_MISSING_FIXES
)
