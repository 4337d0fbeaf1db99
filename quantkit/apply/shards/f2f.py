"""The Quark 0.13 file-to-file replay of the per-shard executor: which shards, in which order, what happens to
each tensor, the files written beside the shards, and the headers as the executor reads them.

Replayed from quark/torch/quantization/file2file_quantization.py (Quark 0.13):
- shards are found with os.walk, processed and indexed in that order (`_get_safetensor_files`); a shard's tensors
  come in file order (safetensors `load_file`), each output shard is `save_file(tensors)` (no metadata);
- a tensor is quantized iff its name passes `_is_linear_weight_tensor` (ends in `.weight`, module not ending in
  `norm`, no `embed`), it has 2+ dims, its module does not fnmatch an exclude pattern, and then the first matching
  `layer_config` pattern or the global scheme applies (`_get_layer_quant_config_by_tensor_name`); it is written as
  `<name>` then `<name>_scale` (`_single_stage_quantize_weight`);
- other linear-named float tensors that are not excluded 2-D+ weights in F16/BF16/F32 are cast to the config's
  dtype (`_quantize_and_save_safetensor_shard`, `_get_model_dtype_from_hf_model_config`); all else passes through;
- `exclude` in config.json is every 2-D+ linear module matching a pattern, sorted (`_build_exclude_aware_quant_config`);
- every other file and folder of the source (not *.safetensors, not README*.md) is copied (`_copy_json_and_py_files`),
  then model.safetensors.index.json and config.json are written with json.dump(indent=4, ensure_ascii=False).

Differences from Quark, on purpose: sources that are already quantized (a quantization_config, or `.weight_scale`/
`.weight_packed`/`.weight_shape` tensors) or hold shards in sub-folders are refused instead of being dequantized or
flattened; an existing non-empty `dst` is refused unless resuming (Quark deletes it); NaN/Inf in a weight to be
quantized is an error (Quark writes garbage scales). With model.safetensors.index.json only the shards it names are
read (Quark quantizes every *.safetensors os.walk finds, so a stray `consolidated.safetensors` stores every tensor
twice), no *.safetensors is copied from a folder, and no tensor may be in two shards. Headers are validated with
safetensors' own rules (quantkit.io.safetensors). The journal `.quantkit-journal.json` lives in `dst` while
the run is incomplete and is removed when it completes, so a finished folder of a clean source holds exactly Quark's
files; resuming keeps a finished shard only when its output and its source re-hash as the journal recorded.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantkit.apply.shards.errors import CorruptShardError, ExecutorError
from quantkit.apply.shards.journal import JOURNAL_NAME
from quantkit.io.config import has_quantization_config, quark_model_dtype
from quantkit.io.files import check_entry, check_tree, copy_tree_checked, link_roots, require_regular_file, scan_folder
from quantkit.io.headers import (
    check_index_complete,
    place_tensor,
    read_config,
    read_index,
    safetensors_files,
    unindexed_weight_files,
)
from quantkit.io.safetensors import DTYPES, HeaderEntry, parse_header, read_parsed_header
from quantkit.schemes import native_schemes
from quantkit.schemes.quark_config import quark_quantization_config

_FLOAT_ST = {"F16", "BF16", "F32"}  # file2file_quantization.py _FLOATING_POINT_DTYPE_STRS


def _native_dtypes(entries: list[HeaderEntry], where: str) -> list[HeaderEntry]:
    for e in entries:
        if DTYPES[e.dtype].torch is None:
            raise ExecutorError(
                f"{where}: tensor {e.name} has dtype {e.dtype}, which the native executor does not "
                "handle; use --engine quark"
            )
    return entries


def parse_shard_header(raw: bytes | bytearray | memoryview, size: int, where: str) -> tuple[int, list[HeaderEntry]]:
    """(data start, entries in file order) of a safetensors file of `size` bytes whose first bytes are `raw`:
    CorruptShardError for anything safetensors itself would refuse (the rules of quantkit.io.safetensors, which
    every header reader of quantkit uses); ExecutorError for a dtype the native executor does not handle."""
    parsed = parse_header(raw, size, where, CorruptShardError)
    return parsed.data_start, _native_dtypes(parsed.entries, where)


def read_shard_header(path: Path) -> tuple[int, list[HeaderEntry]]:
    """(data start, the tensors of shard `path` in file order), from its header alone (the rules of
    `parse_shard_header`)."""
    parsed = read_parsed_header(path, CorruptShardError)
    return parsed.data_start, _native_dtypes(parsed.entries, str(path))


def is_linear_weight_name(name: str) -> bool:
    """file2file_quantization.py `_is_linear_weight_tensor`: `<module>.weight`, module not ending in "norm" and
    without "embed"."""
    if "." not in name:
        return False
    module, param = name.rsplit(".", 1)
    return param == "weight" and not module.endswith("norm") and "embed" not in module


def module_of(name: str) -> str:
    return name.removesuffix(".weight")


@functools.lru_cache(maxsize=64)
def matcher(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """`lambda name: any(fnmatch.fnmatch(name, p) for p in patterns)`, in one set lookup and one regex: a recipe's
    exclusions are hundreds of module names, tested against every tensor of the model. (fnmatch.fnmatch is
    fnmatchcase on POSIX, where os.path.normcase changes nothing.)"""
    if os.path.normcase("A") != "A":  # case-insensitive platforms: keep fnmatch's own rule
        return lambda name: any(fnmatch.fnmatch(name, p) for p in patterns)
    literal = {p for p in patterns if not any(c in p for c in "*?[")}
    wild = [p for p in patterns if p not in literal]
    regex = re.compile("|".join(fnmatch.translate(p) for p in wild)) if wild else None
    return lambda name: name in literal or (regex is not None and regex.match(name) is not None)


def scheme_for(
    name: str, shape: tuple[int, ...], scheme: str, exclude: list[str], layer_config: dict[str, str] | None
) -> str | None:
    """The scheme Quark's file-to-file path quantizes tensor `name` with, or None if it passes the tensor through."""
    if not is_linear_weight_name(name) or len(shape) < 2:
        return None
    module = module_of(name)
    if matcher(tuple(exclude))(module):
        return None
    for pattern, s in (layer_config or {}).items():
        if fnmatch.fnmatch(module, pattern):
            return s
    return scheme


def find_shards(src: Path) -> list[str]:
    """Source shards in the order Quark 0.13 processes and indexes them (`_get_safetensor_files`: os.walk).

    With model.safetensors.index.json only the files it names, each of which must exist: the index is the truth, as
    for vLLM and transformers (Quark would quantize a stray `consolidated.safetensors` too, storing every tensor
    twice). Without one, every *.safetensors file, and none may hold a tensor another one holds (checked in
    plan_shards).
    """
    found = []
    for root, _dirs, files in os.walk(src):
        for f in files:
            if f.endswith(".safetensors"):
                found.append(os.path.relpath(os.path.join(root, f), src))
    if read_index(src) is not None:
        named = set(safetensors_files(src))
        return [f for f in found if f in named]
    nested = [f for f in found if os.sep in f]
    if nested:
        raise ExecutorError(
            f"{src}: safetensors files in sub-folders ({nested[0]}); Quark's file-to-file path would "
            "flatten them into one folder: move them or quantize that folder on its own"
        )
    if not found:
        raise ExecutorError(f"{src}: no *.safetensors files; point to a Hugging Face checkpoint folder")
    return found


@dataclass
class ShardPlan:
    shards: list[str]
    exclude_modules: list[str]
    source_floating_excluded: set[str]
    model_dtype: str
    sizes: dict[str, int]
    ignored: list[str] = field(default_factory=list)  # *.safetensors the index does not name
    headers: dict[str, tuple[int, list[HeaderEntry]]] = field(default_factory=dict)  # data start, entries


def plan_shards(
    src: Path, scheme: str, exclude: list[str], layer_config: dict[str, str] | None, decode: Any = None
) -> ShardPlan:
    native = native_schemes()
    for s in [scheme, *(layer_config or {}).values()]:
        if s not in native:
            raise ExecutorError(f"scheme {s!r}: the native executor supports {', '.join(native)}; use Quark for others")
    cfg_path = src / "config.json"
    require_regular_file(cfg_path, fix="config.json must be a regular file", error=ExecutorError)
    if not cfg_path.is_file():
        raise ExecutorError(f"{src}: no config.json; point to a Hugging Face checkpoint folder")
    config = read_config(src)
    if decode is None and has_quantization_config(config):
        raise ExecutorError(
            f"{src}: config.json has a quantization_config (already quantized); quantize the "
            "unquantized checkpoint, or use Quark's path, which dequantizes first"
        )
    shards = find_shards(src)
    weight_map = read_index(src)
    placed: dict[str, str] = {}
    excluded: set[str] = set()
    floating: set[str] = set()
    sizes = {}
    headers: dict[str, tuple[int, list[HeaderEntry]]] = {}
    exclude_match = matcher(tuple(exclude))
    for shard in shards:
        path = src / shard
        sizes[shard] = path.stat().st_size
        headers[shard] = read_shard_header(path)
        for e in headers[shard][1]:
            place_tensor(src, weight_map, placed, e.name, shard)
            if decode is None and e.name.endswith((".weight_packed", ".weight_shape", ".weight_scale", "_scale_inv")):
                raise ExecutorError(
                    f"{path}: tensor {e.name} is a quantized checkpoint's; quantize the unquantized "
                    "checkpoint, or use Quark's path, which dequantizes first"
                )
            if is_linear_weight_name(e.name) and len(e.shape) >= 2 and exclude_match(module_of(e.name)):
                excluded.add(module_of(e.name))
                if e.dtype in _FLOAT_ST:
                    floating.add(e.name)
    check_index_complete(src, weight_map, placed)
    dtype = quark_model_dtype(config)
    import torch

    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise ExecutorError(
            f"{cfg_path}: dtype {dtype!r} is not a torch dtype; set torch_dtype to bfloat16, float16 or float32"
        )
    return ShardPlan(shards, sorted(excluded), floating, dtype, sizes, unindexed_weight_files(src), headers)


def copy_aux_quark(src: Path, dst: Path) -> None:
    """file2file_quantization.py `_copy_json_and_py_files`: every folder and every file but *.safetensors and
    README*.md, in os.listdir order. Unlike Quark, no *.safetensors inside a folder either: only the index's shards
    are weights of the output (a stray copy of them would be loaded by anything that globs the folder).

    Unlike Quark, nothing that could leak or hang is copied: every entry, and every entry of every folder copied, is
    checked first (quantkit.io.files.check_entry), and a link that leaves the source (or its HF cache repo's blobs),
    a link to a folder or a link loop, a pipe or a device is refused (Quark follows links: `self -> .` copies the
    folder into itself until paths get too long, `notes.txt -> ~/.cache/huggingface/token` copies the token)."""
    roots = link_roots(src)
    for name in os.listdir(src):
        s, d = src / name, dst / name
        if check_entry(s, roots, ExecutorError) == "folder":
            copy_tree_checked(s, d, roots, ExecutorError, skip="*.safetensors")
            continue
        if name.endswith(".safetensors") or name == JOURNAL_NAME:
            continue
        if name.lower().endswith(".md") and "readme" in name.lower():
            continue
        shutil.copy2(os.path.realpath(s), d)


def check_aux_quark(src: Path) -> None:
    """Before any work: what `copy_aux_quark` will copy, checked as it will be (the source's top level and every
    folder in it), so that a link out of the source or a pipe is refused before the first shard."""
    roots = link_roots(src)
    entries = scan_folder(src, inside=True, hidden=True, error=ExecutorError)
    for name in entries.folders:
        check_tree(src / name, roots, ExecutorError)


def _remove_quantization_config(config: dict[str, Any]) -> None:
    """file2file_quantization.py `_remove_quantization_config`."""
    for key in [k for k in config if k == "quantization_config"]:
        del config[key]
    for value in config.values():
        if isinstance(value, dict):
            _remove_quantization_config(value)


def write_quark_config(
    src: Path, dst: Path, scheme: str, exclude_modules: list[str], layer_config: dict[str, str] | None
) -> None:
    """file2file_quantization.py `_export_quant_config`."""
    config = read_config(src)
    _remove_quantization_config(config)
    config["quantization_config"] = quark_quantization_config(scheme, exclude_modules, layer_config)
    with open(dst / "config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=4)
