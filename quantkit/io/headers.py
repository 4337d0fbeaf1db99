"""HF checkpoint folders without torch (stdlib and pydantic only): the index as the truth, the shard list, every tensor
from the headers (read by quantkit.io.safetensors), config.json and small JSON files."""

import contextlib
import gc
import os
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from pathlib import Path
from typing import Any, NamedTuple

from quantkit.errors import CheckpointError, QuantkitError
from quantkit.io.config import validate_model_config
from quantkit.io.files import require_regular_file
from quantkit.io.jsonin import JsonInputError, parse_json
from quantkit.io.safetensors import HeaderColumns, json_object, read_header_columns
from quantkit.io.safetensors import read_header as read_header  # re-exported: header readers import it from here

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
# config.json, indexes and reports are small; a larger file is corrupt or hostile, and parsing it would eat memory.
MAX_JSON_FILE_BYTES = 64_000_000

_REGENERATE = "re-download or regenerate the index"


class _Index(NamedTuple):
    """A checked index: its weight map, and the shard files it names (sorted)."""

    weight_map: dict[str, str]
    files: list[str]


# Indexes already checked in this process, by resolved path, with their text: the plan, the layer check and the
# executor each ask for the weight map of the same source, and a 67,667-tensor index costs tens of milliseconds to
# parse and check. A hit needs the same text, so a changed index is read afresh.
_INDEXES: dict[str, tuple[str, _Index]] = {}


class TensorInfo(NamedTuple):
    """Where a tensor lives (shard file name relative to the checkpoint folder) and what it is."""

    file: str
    dtype: str
    shape: tuple[int, ...]


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off while a header-sized structure is built (nested uses are fine).

    Reading a large index makes hundreds of thousands of small acyclic objects (entries, shapes, names); each
    allocation burst triggers collections that walk every object made so far, which on a 67,667-tensor index cost
    more than the parsing itself. Reference counting still frees everything; the collector resumes afterwards.

    On resuming, the objects made meanwhile would all be young, and the first collections would walk them all, once
    per generation (on that index ~210k objects, 0.04-0.06 s each): they are moved to the oldest generation first.
    The result does not depend on what another library did to the process's collector: when nothing is frozen,
    gc.freeze then gc.unfreeze moves them at no cost; when something is (vLLM's serve benchmark calls gc.freeze()
    in vllm/utils/gc_utils.py freeze_gc_heap and never unfreezes), unfreezing would release the process's frozen
    objects, so one collection of the young generations moves them instead (one walk instead of two)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            else:
                gc.collect(1)  # survivors of generations 0 and 1 go to the oldest; the frozen stay frozen
            gc.enable()


def read_index(folder: str | Path) -> dict[str, str] | None:
    """The `weight_map` (tensor name -> shard file) of a sharded checkpoint, or None when it has no index.

    The index is the truth about which files hold the weights (as for vLLM's `filter_duplicate_safetensors_files`
    in vllm/model_executor/model_loader/weight_utils.py, and transformers): it must name each tensor once, and only
    plain `.safetensors` file names of the folder itself (vLLM globs `*.safetensors` there and refuses an index
    naming a file that is not among them).
    """
    index = _checked_index(Path(folder))
    return None if index is None else dict(index.weight_map)


def _checked_index(folder: Path) -> _Index | None:
    """read_index's index as this process's cache holds it: for readers in this module, which never change it."""
    index_path = folder / INDEX_FILE
    if not index_path.is_file():
        return None
    text = read_json_text(index_path, _REGENERATE)
    key = str(index_path.resolve())
    cached = _INDEXES.get(key)
    if cached is not None and cached[0] == text:  # the same bytes, already checked in this process
        return cached[1]
    plain = _plain_weight_map(text)
    if plain is not None:
        weight_map, files = plain
    else:  # anything but the plain form: read with the hook that finds repeated names
        index = parse_json_text(text, index_path, _REGENERATE, object_pairs_hook=json_object)
        hooked = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(hooked, dict):
            raise CheckpointError(f"{index_path}: has no 'weight_map' object of tensor name -> file; {_REGENERATE}")
        if set(map(type, hooked.values())) - {str}:
            for name, file in hooked.items():
                if not isinstance(file, str):
                    shown = "null" if file is None else f"{type(file).__name__} {str(file)[:40]}"
                    raise CheckpointError(
                        f"{index_path}: weight_map.{name[:100]}: should be a shard file name, got "
                        f"{shown}; {_REGENERATE}"
                    )
        for name, first in getattr(hooked, "shadowed", ()):
            raise CheckpointError(
                f"{index_path}: names tensor {name!r} twice (in {str(first)[:100]!r} and "
                f"{hooked[name][:100]!r}); {_REGENERATE}"
            )
        weight_map, files = dict(hooked), set(hooked.values())  # a plain dict, whatever the parser made
    shards = sorted(files)
    for file in shards:
        # vLLM loads only the *.safetensors files beside the index (weight_utils.py filter_duplicate_safetensors_files
        # joins the folder with each weight_map value, then keeps the globbed files among them): a path is no shard.
        if not file.endswith(".safetensors") or "/" in file or "\\" in file or file.startswith("."):
            raise CheckpointError(
                f"{index_path}: names shard {file[:200]!r}, which is not a .safetensors file of the "
                f"checkpoint folder itself; {_REGENERATE}"
            )
    checked = _Index(weight_map, shards)
    _INDEXES[key] = (text, checked)
    if len(_INDEXES) > 8:
        del _INDEXES[next(iter(_INDEXES))]
    return checked


def _plain_weight_map(text: str) -> tuple[dict[str, str], set[str]] | None:
    """The weight map and its set of files, of an index without a backslash whose weight map maps strings to
    strings and that repeats no key anywhere, parsed without a hook; None for any other index (the hook path then
    judges it, with its messages). Without backslashes every `"` delimits a string, so the text holds
    text.count('"') / 2 of them; a repeated key leaves no trace in the dicts json.loads builds, but is a string more
    in the text than in them."""
    if "\\" in text:
        return None
    try:
        index = parse_json(text)
    except JsonInputError:  # refused by the hook path, with its message
        return None
    weight_map = index.get("weight_map") if type(index) is dict else None
    if type(weight_map) is not dict:
        return None
    try:
        files = set(weight_map.values())
    except TypeError:  # a list or an object as a file name
        return None
    if set(map(type, files)) - {str}:  # (a string equals no other JSON value, so the distinct values tell)
        return None
    rest = {k: v for k, v in index.items() if k != "weight_map"}
    if text.count('"') != 2 * (1 + 2 * len(weight_map) + _strings(rest)):
        return None
    return weight_map, files


def _strings(value: Any) -> int:
    """How many strings (keys included) a parsed JSON value holds."""
    count, stack = 0, [value]
    while stack:
        v = stack.pop()
        if type(v) is str:
            count += 1
        elif type(v) is dict:
            count += len(v)
            stack.extend(v.values())
        elif type(v) is list:
            stack.extend(v)
    return count


def safetensors_files(folder: str | Path) -> list[str]:
    """Shard file names of a checkpoint folder: those its index names (each must exist), else every *.safetensors
    in it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: checkpoint folder not found; check the path")
    return _shard_files(folder, _checked_index(folder))


def _shard_files(folder: Path, index: _Index | None) -> list[str]:
    if index is not None:
        files = list(index.files)
        for file in files:
            if not (folder / file).is_file():
                raise CheckpointError(
                    f"{folder / INDEX_FILE}: names shard {file}, which is missing; re-download the checkpoint"
                )
        return files
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        from quantkit.io.files import refuse_pickle_only

        refuse_pickle_only(folder)
        raise CheckpointError(f"{folder}: no .safetensors files and no {INDEX_FILE}; is this a HF checkpoint folder?")
    return files


def bin_conversion(folder: str | Path) -> str:
    """The one command that rewrites a folder's pickle weights (*.bin, *.pt, *.pth) as safetensors beside them, loading each with
    torch's weights-only unpickler (tensors and plain containers only, never arbitrary objects)."""
    import json
    import shlex

    code = (
        "import glob, os, torch; from safetensors.torch import save_file; "
        '[save_file(torch.load(f, weights_only=True), os.path.splitext(f)[0] + ".safetensors") for p in '
        f'("*.bin", "*.pt", "*.pth") for f in sorted(glob.glob(os.path.join({json.dumps(str(folder))}, p)))]'
    )
    return f"python -c {shlex.quote(code)}"


def unindexed_weight_files(folder: str | Path) -> list[str]:
    """*.safetensors files anywhere in `folder` that its index does not name (relative paths, sorted): neither
    quantized nor copied (Mistral's repos ship a `consolidated.safetensors` beside the sharded weights, holding the
    same tensors). Empty without an index."""
    folder = Path(folder)
    index = _checked_index(folder)
    if index is None:
        return []
    named = set(index.files)
    found = []
    for root, _dirs, files in os.walk(folder):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), folder)
            if f.endswith(".safetensors") and rel not in named:
                found.append(rel)
    return sorted(found)


def place_tensor(folder: Path, weight_map: dict[str, str] | None, placed: dict[str, str], name: str, file: str) -> None:
    """Record that shard `file` holds tensor `name`, refusing a tensor held by two shards, and one that the index
    places elsewhere or does not list (vLLM would load every tensor of an indexed shard, so a disagreement means a
    tensor stored twice or a stale index)."""
    if weight_map is not None and weight_map.get(name) != file:
        where = weight_map.get(name)
        said = f"places in {where}" if where is not None else "does not list"
        raise CheckpointError(
            f"{folder / file}: holds tensor {name!r}, which {INDEX_FILE} {said}; the index is stale "
            "or the shard is stray: regenerate the index or re-download the checkpoint"
        )
    if name in placed:
        raise CheckpointError(
            f"{folder}: tensor {name!r} is in both {placed[name]} and {file}; remove the stale shard "
            f"(without {INDEX_FILE}, every *.safetensors file is loaded)"
        )
    placed[name] = file


def check_index_complete(folder: Path, weight_map: dict[str, str] | None, placed: Iterable[str]) -> None:
    """Every tensor the index lists is in the shard it names (`placed`: the names found in the shards the index
    names, each in the shard the index names)."""
    if weight_map is None:
        return
    missing = sorted(set(weight_map) - set(placed))
    if missing:
        raise CheckpointError(
            f"{folder / INDEX_FILE}: lists {len(missing)} tensor(s) absent from their shard, e.g. "
            f"{missing[0]!r} in {weight_map[missing[0]]}; the index is stale, regenerate it"
        )


def checkpoint_tensors(folder: str | Path) -> dict[str, TensorInfo]:
    """Every tensor of a checkpoint folder with its shard, dtype and shape, read from headers only.

    With model.safetensors.index.json the index is authoritative (as for transformers and vLLM): only the files it
    names are read, and their headers must agree with it; without one, all *.safetensors files in the folder are
    read, and no tensor may be in two of them.
    """
    with paused_gc():
        return _checkpoint_tensors(Path(folder))


def _checkpoint_tensors(folder: Path) -> dict[str, TensorInfo]:
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: checkpoint folder not found; check the path")
    index = _checked_index(folder)  # read once: the shard list and the placement check both follow it
    weight_map = None if index is None else index.weight_map
    # Every header is read before any is checked against the index or the others, and the tensor dict is built in
    # one go: the placement lookups and the dict then stay in the cache, which the parsing of the next header would
    # evict (on a 67,667-tensor index, interleaving them costs twice as much).
    read: list[tuple[str, HeaderColumns]] = []
    try:
        for file in _shard_files(folder, index):
            read.append((file, read_header_columns(folder / file)))
    except QuantkitError:
        _place_shards(folder, weight_map, read)  # a fault in an earlier shard is named first, as it was found first
        raise
    if weight_map is not None and not all(set(map(weight_map.get, header.names)) <= {file} for file, header in read):
        _place_shards(folder, weight_map, read)  # raises, naming the first tensor the index places elsewhere
    # The tensors in shard order, each shard's in the header's own order.
    tensors = dict(
        zip(
            chain.from_iterable(header.names for _, header in read),
            chain.from_iterable(_shard_infos(file, header) for file, header in read),
        )
    )
    if weight_map is None and len(tensors) != sum(len(header.names) for _, header in read):
        _place_shards(folder, weight_map, read)  # raises, naming a tensor held by two shards
    if weight_map is not None and len(tensors) != len(weight_map):
        check_index_complete(folder, weight_map, tensors)
    return tensors


def _shard_infos(file: str, header: HeaderColumns) -> Iterator[TensorInfo]:
    """Each tensor's TensorInfo, in the header's order: one per kind of tensor of the shard, shared by its tensors (a
    TensorInfo is immutable)."""
    return map([TensorInfo(file, *kind) for kind in header.kinds].__getitem__, header.kind)


def _place_shards(folder: Path, weight_map: dict[str, str] | None, read: list[tuple[str, HeaderColumns]]) -> None:
    """Each shard's tensors placed in turn (place_tensor), raising on the first that the index places elsewhere or
    that an earlier shard holds."""
    placed: dict[str, str] = {}
    for file, header in read:
        for name in header.names:
            place_tensor(folder, weight_map, placed, name, file)


def read_config(folder: str | Path) -> dict[str, Any]:
    """The parsed config.json of a checkpoint folder, every key quantkit reads checked for its type
    (quantkit.io.config.ModelConfig)."""
    path = Path(folder) / CONFIG_FILE
    if not Path(folder).is_dir():
        raise CheckpointError(f"{folder}: not a folder; pass the checkpoint folder that holds config.json")
    if not path.exists():
        raise CheckpointError(f"{path}: not found; a HF checkpoint folder needs a config.json")
    config = load_json_file(path, "fix or regenerate it")
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: is a JSON {type(config).__name__}, expected an object")
    from quantkit.io.counts import check_config_counts

    check_config_counts(config, path)
    return validate_model_config(config, path)


def load_json_file(
    path: str | Path,
    fix: str,
    error: type[QuantkitError] = CheckpointError,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """Parse a small JSON file (config, index, report); every way it can be unreadable is one `error`."""
    return parse_json_text(read_json_text(path, fix, error), path, fix, error, object_pairs_hook)


def read_json_text(path: str | Path, fix: str, error: type[QuantkitError] = CheckpointError) -> str:
    """The text of a small JSON file (at most MAX_JSON_FILE_BYTES, UTF-8); every way it can be unreadable is one
    `error`."""
    path = Path(path)
    require_regular_file(path, fix=fix, error=error)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_FILE_BYTES:
            raise error(
                f"{path}: {size} bytes, too large for a JSON file of this kind (at most {MAX_JSON_FILE_BYTES}); {fix}"
            )
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: not found; {fix}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder, expected a JSON file; {fix}") from None
    except PermissionError:
        raise error(f"{path}: permission denied; make the file readable") from None
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror or e}); {fix}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text; {fix}") from None


def parse_json_text(
    text: str,
    path: str | Path,
    fix: str,
    error: type[QuantkitError] = CheckpointError,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """The document `text` read from `path`; unreadable JSON is one `error`."""
    try:
        return parse_json(text, object_pairs_hook=object_pairs_hook)
    except JsonInputError as e:
        raise error(f"{path}: {e}; {fix}") from None
