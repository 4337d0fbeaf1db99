"""Reading safetensors headers and HF checkpoint folders without torch (stdlib and pydantic only), so inspecting never
imports torch."""

import math
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict

from quantkit.errors import CheckpointError, QuantkitError
from quantkit.io.jsonin import JsonInputError, parse_json
from quantkit.io.schema import validate

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
METADATA_KEY = "__metadata__"

# The safetensors crate refuses headers above 100 MB (MAX_HEADER_SIZE); a larger length means corruption.
MAX_HEADER_BYTES = 100_000_000

# Bytes per element of whole-byte safetensors dtypes; used to check each tensor's byte range against its shape.
# Sub-byte dtypes (F4, F6_*) are left out: their packing is not checked here.
DTYPE_BYTES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8, "C64": 8,
}  # fmt: skip
# Every dtype the safetensors format defines (safetensors/src/tensor.rs `Dtype`), sub-byte ones included.
KNOWN_DTYPES = set(DTYPE_BYTES) | {"F4", "F6_E2M3", "F6_E3M2"}
# config.json, indexes and reports are small; a larger file is corrupt or hostile, and parsing it would eat memory.
MAX_JSON_FILE_BYTES = 64_000_000

_REFETCH = "the file is truncated or corrupt; re-download or re-export it"


class TensorInfo(NamedTuple):
    """Where a tensor lives (shard file name relative to the checkpoint folder) and what it is."""

    file: str
    dtype: str
    shape: tuple[int, ...]


def read_header(path: str | Path) -> dict[str, Any]:
    """Parse and validate the JSON header of one safetensors file without reading tensor data.

    Returns the header as stored: tensor name -> {dtype, shape, data_offsets}, plus `__metadata__` if present.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path}: only {size} bytes, too short for a safetensors header; {_REFETCH}")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len == 0 or header_len > MAX_HEADER_BYTES or 8 + header_len > size:
                raise CheckpointError(
                    f"{path}: safetensors header length {header_len} does not fit the file's {size} bytes; {_REFETCH}"
                )
            raw = f.read(header_len)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found; check the checkpoint folder") from None
    except IsADirectoryError:
        raise CheckpointError(f"{path}: is a folder, expected a .safetensors file") from None
    except PermissionError:
        raise CheckpointError(f"{path}: permission denied; make the file readable") from None
    try:
        # allow_nan=False: the safetensors crate parses headers with serde_json, which refuses NaN and Infinity.
        header = parse_json(raw, allow_nan=False)
    except JsonInputError as e:
        raise CheckpointError(f"{path}: safetensors header {e}; {_REFETCH}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header is a JSON {type(header).__name__}, not an object; {_REFETCH}")
    data_len = size - 8 - header_len
    for name, entry in header.items():
        if name != METADATA_KEY:
            _check_entry(path, name, entry, data_len)
    metadata = header.get(METADATA_KEY)
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        # safetensors' Metadata.metadata is HashMap<String, String>: it refuses to open anything else
        raise CheckpointError(f"{path}: safetensors __metadata__ must map names to strings; {_REFETCH}")
    return header


def _is_count(value: Any) -> bool:
    # JSON true/false are Python bools, which are ints: safetensors (serde, usize) refuses them
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_entry(path: Path, name: str, entry: Any, data_len: int) -> None:
    """Check one tensor entry's fields and that its bytes lie inside the file."""
    ok = (
        isinstance(entry, dict)
        and isinstance(entry.get("dtype"), str)
        and isinstance(entry.get("shape"), list)
        and all(_is_count(d) for d in entry["shape"])
        and isinstance(entry.get("data_offsets"), list)
        and len(entry["data_offsets"]) == 2
        and all(_is_count(o) for o in entry["data_offsets"])
    )
    if not ok:
        raise CheckpointError(
            f"{path}: tensor {name!r} header entry is malformed (needs dtype, shape, data_offsets); {_REFETCH}"
        )
    if entry["dtype"] not in KNOWN_DTYPES:
        raise CheckpointError(f"{path}: tensor {name!r} has dtype {entry['dtype'][:20]!r}, which safetensors does "
                              f"not define; {_REFETCH}")
    begin, end = entry["data_offsets"]
    if not 0 <= begin <= end <= data_len:
        raise CheckpointError(
            f"{path}: tensor {name!r} bytes {begin}..{end} lie outside the file's {data_len} data bytes; {_REFETCH}"
        )
    itemsize = DTYPE_BYTES.get(entry["dtype"])
    if itemsize is not None and (expected := math.prod(entry["shape"]) * itemsize) != end - begin:
        raise CheckpointError(
            f"{path}: tensor {name!r} is {entry['dtype']} {entry['shape']} ({expected} bytes) "
            f"but spans {end - begin} bytes; {_REFETCH}"
        )


def read_index(folder: str | Path) -> dict[str, str] | None:
    """The `weight_map` (tensor name -> shard file) of a sharded checkpoint, or None when it has no index."""
    index_path = Path(folder) / INDEX_FILE
    if not index_path.is_file():
        return None
    index = load_json_file(index_path, "re-download or regenerate the index")
    if not isinstance(index, dict) or "weight_map" not in index:
        raise CheckpointError(
            f"{index_path}: has no 'weight_map' object of tensor name -> file; re-download or regenerate the index"
        )
    return validate(_Index, index, str(index_path), "re-download or regenerate the index", CheckpointError).weight_map


def _shard_name(name: str) -> str:
    # vLLM loads only the *.safetensors files beside the index (weight_utils.py filter_duplicate_safetensors_files
    # joins the folder with each weight_map value, then keeps the globbed files among them): a path is never a shard.
    if not name.endswith(".safetensors") or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"{name[:80]!r} is not the name of a .safetensors file beside the index")
    return name


class _Index(BaseModel):
    """model.safetensors.index.json: tensor name -> shard file name (`metadata` is not read)."""

    model_config = ConfigDict(extra="allow", strict=True)
    weight_map: dict[str, Annotated[str, AfterValidator(_shard_name)]]


def safetensors_files(folder: str | Path) -> list[str]:
    """Shard file names of a checkpoint folder: those its index names, else every *.safetensors in it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: checkpoint folder not found; check the path")
    weight_map = read_index(folder)
    if weight_map is not None:
        return sorted(set(weight_map.values()))
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no .safetensors files and no {INDEX_FILE}; is this a HF checkpoint folder?")
    return files


def checkpoint_tensors(folder: str | Path) -> dict[str, TensorInfo]:
    """Every tensor of a checkpoint folder with its shard, dtype and shape, read from headers only.

    With model.safetensors.index.json the index is authoritative (as for transformers and vLLM) and must agree
    with the shard headers; without one, all *.safetensors files in the folder are read.
    """
    folder = Path(folder)
    files = safetensors_files(folder)
    weight_map = read_index(folder)
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        if weight_map is not None and not (folder / file).is_file():
            raise CheckpointError(
                f"{folder / INDEX_FILE}: names shard {file}, which is missing; re-download the checkpoint"
            )
        header = read_header(folder / file)
        for name, entry in header.items():
            if name == METADATA_KEY or (weight_map is not None and weight_map.get(name) != file):
                continue
            if name in tensors:
                raise CheckpointError(
                    f"{folder}: tensor {name!r} is in both {tensors[name].file} and {file}; remove the stale shard"
                )
            tensors[name] = TensorInfo(file, entry["dtype"], tuple(entry["shape"]))
    if weight_map is not None:
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise CheckpointError(
                f"{folder / INDEX_FILE}: lists {len(missing)} tensor(s) absent from their shard, e.g. "
                f"{missing[0]!r} in {weight_map[missing[0]]}; the index is stale, regenerate it"
            )
    return tensors


@dataclass(frozen=True)
class CheckpointSummary:
    """What a HF checkpoint folder holds, from config.json and safetensors headers."""

    name: str
    path: str
    architecture: str | None
    num_layers: int | None
    hidden_size: int | None
    vocab_size: int | None
    size_mb: float
    shards: int
    tensors: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_config(folder: str | Path) -> dict[str, Any]:
    """The parsed config.json of a checkpoint folder, every key quantkit reads checked for its type
    (quantkit.naming.config.ModelConfig)."""
    path = Path(folder) / CONFIG_FILE
    if not Path(folder).is_dir():
        raise CheckpointError(f"{folder}: not a folder; pass the checkpoint folder that holds config.json")
    if not path.exists():
        raise CheckpointError(f"{path}: not found; a HF checkpoint folder needs a config.json")
    config = load_json_file(path, "fix or regenerate it")
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: is a JSON {type(config).__name__}, expected an object")
    from quantkit.naming.config import validate_model_config  # naming imports io: import it when used

    return validate_model_config(config, path)


def load_json_file(path: str | Path, fix: str, error: type[QuantkitError] = CheckpointError) -> Any:
    """Parse a small JSON file (config, index, report); every way it can be unreadable is one `error`."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_FILE_BYTES:
            raise error(f"{path}: {size} bytes, too large for a JSON file of this kind (at most "
                        f"{MAX_JSON_FILE_BYTES}); {fix}")
        return parse_json(path.read_text(encoding="utf-8"))
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
    except JsonInputError as e:
        raise error(f"{path}: {e}; {fix}") from None


def _config_value(config: dict[str, Any], key: str) -> Any:
    # Multimodal wrappers (e.g. Kimi-K2.5) keep the language model's sizes under text_config.
    from quantkit.naming.config import text_config

    return config[key] if key in config else text_config(config).get(key)


def summarize_checkpoint(folder: str | Path) -> CheckpointSummary:
    """Summarise a HF checkpoint folder without loading any tensor data."""
    folder = Path(folder)
    config = read_config(folder)
    architectures = config.get("architectures")
    files = safetensors_files(folder)
    tensors = checkpoint_tensors(folder)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return CheckpointSummary(
        name=folder.name,
        path=str(folder),
        architecture=architectures[0] if isinstance(architectures, list) and architectures else None,
        num_layers=_config_value(config, "num_hidden_layers"),
        hidden_size=_config_value(config, "hidden_size"),
        vocab_size=_config_value(config, "vocab_size"),
        size_mb=round(size / 1e6, 3),
        shards=len(files),
        tensors=len(tensors),
    )
