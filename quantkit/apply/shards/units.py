"""The tensor-granular plan of the per-shard executor, from the headers alone: every source shard as units (one
tensor the quantizer sees, with the source parts it is made of, wherever they live), cut into batches of
consecutive file bytes that fit the memory budget, and every output shard's header and tensor offsets known before
a byte of it is written (so it is written as a stream, `quantkit.apply.shards.writer`).

A unit of a plain source is one tensor. A unit of a quantized source (quantkit.io.formats) is one decoded module:
FP8-block `x.weight` + `x.weight_scale_inv`, INT4 `x.weight_packed` + `x.weight_scale` + `x.weight_shape`. The
anchor (`x.weight`, `x.weight_packed`) decides which shard and batch decode it; its other parts are fetched by
offset from wherever the index puts them (the same shard's scale region, or another shard: HF's sharding cuts by
size, and DeepSeek's own inference/fp8_cast_bf16.py fetches a scale from another file for that reason), never by
reading the other shard. What a unit becomes replays Quark 0.13's shard loop (`scheme_for`, the cast rule of
f2f.py), so the output's header is exactly the one `safetensors.torch.save_file` would write for the tensors Quark
builds.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from quantkit.apply.shards.errors import ExecutorError
from quantkit.apply.shards.f2f import ShardPlan, is_linear_weight_name, scheme_for
from quantkit.io.formats import fp8_scale_name, fused_expert_parts, scaled_weight_of
from quantkit.io.safetensors import ST_ORDER, HeaderEntry, header_bytes, tensor_nbytes
from quantkit.schemes import expected_layout

FP8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0")
FP4_DTYPES = ("I8", "U8", "F4")  # packed E2M1, two codes a byte (DeepSeek-V4 stores I8)
MXFP4 = "mxfp4"
_TORCH_FLOAT = {"F16", "BF16", "F32", "F64"}


@dataclass(frozen=True)
class Part:
    """One source tensor's bytes: its shard, its header entry, and where its bytes start in that file."""

    shard: str
    entry: HeaderEntry
    offset: int  # absolute file offset (data start + entry.begin)

    @property
    def nbytes(self) -> int:
        return self.entry.end - self.entry.begin


@dataclass(frozen=True)
class OutTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dtype, self.shape)


@dataclass
class Unit:
    """One tensor the quantizer sees and what it becomes in the output (Quark's insertion order: name[, name_scale])."""

    name: str
    dtype: str  # as the quantizer sees it (BF16 for a decoded module)
    shape: tuple[int, ...]
    # relayout: a source module already in OCP MXFP4 (DeepSeek-V4's FP4 experts), written in Quark's MXFP4 layout as
    # byte views of its parts (quantkit.io.formats.relayout_fp4_experts): no arithmetic, no second rounding
    kind: Literal["quantize", "cast", "keep", "drop", "relayout"]
    scheme: str | None
    parts: list[Part]  # parts[0] is the anchor, in this unit's shard
    decoded: bool
    outputs: list[OutTensor]
    fused: tuple[int, str] | None = None  # fused-experts: (expert, part) of parts[0] (quantkit.io.formats)

    @property
    def source_bytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def host_bytes(self, decode_on_host: bool) -> int:
        """Host memory this unit adds beyond its source bytes while in flight: its outputs (a kept plain tensor is
        written from the source bytes themselves) and, decoded on the host, its decoded values."""
        if self.kind == "drop":
            return 0
        out = 0 if (self.kind == "keep" and not self.decoded) else sum(o.nbytes for o in self.outputs)
        decoded = tensor_nbytes(self.dtype, self.shape) if self.decoded and decode_on_host else 0
        return out + decoded


@dataclass
class Batch:
    """Consecutive bytes [begin, end) of one source shard and the units anchored in them; `side` are the parts of
    those units that lie outside the range (fetched by offset)."""

    shard: str
    index: int  # within its shard
    begin: int
    end: int
    units: list[Unit]
    side: list[Part]
    cost: int = 0  # host bytes while in flight (source range + side parts + outputs + decoded)

    @property
    def read_bytes(self) -> int:
        return self.end - self.begin + sum(p.nbytes for p in self.side)


@dataclass
class ShardLayout:
    """One source shard through the executor: its units in file order, its batches, and its output's header."""

    name: str
    size: int
    data_start: int
    units: list[Unit]
    batches: list[Batch] = field(default_factory=list)
    head: bytes = b""
    offsets: dict[str, int] = field(default_factory=dict)  # output tensor -> absolute offset in the output file
    out_size: int = 0
    names: list[str] = field(default_factory=list)  # output tensors in Quark's insertion order (the index's)
    depends_on: list[str] = field(default_factory=list)  # other shards this one takes parts from
    entries: list[HeaderEntry] = field(default_factory=list)  # every tensor of the source shard, in file order

    @property
    def out_count(self) -> int:
        return len(self.offsets)

    @property
    def outputs(self) -> list[OutTensor]:
        return [o for u in self.units for o in u.outputs]


def _read_small(src: Path, parts: list[Part]) -> dict[str, bytes]:
    """The bytes of a few small parts, adjacent ones read together (one read per run of adjacent tensors)."""
    out: dict[str, bytes] = {}
    by_shard: dict[str, list[Part]] = {}
    for p in parts:
        by_shard.setdefault(p.shard, []).append(p)
    for shard, ps in by_shard.items():
        ps.sort(key=lambda p: p.offset)
        fd = os.open(src / shard, os.O_RDONLY)
        try:
            i = 0
            while i < len(ps):
                j = i
                while j + 1 < len(ps) and ps[j + 1].offset == ps[j].offset + ps[j].nbytes:
                    j += 1
                start, stop = ps[i].offset, ps[j].offset + ps[j].nbytes
                raw = os.pread(fd, stop - start, start)
                for p in ps[i : j + 1]:
                    out[p.entry.name] = raw[p.offset - start : p.offset - start + p.nbytes]
                i = j + 1
        finally:
            os.close(fd)
    return out


def _int4_cols(raw: bytes, entry: HeaderEntry, name: str) -> int:
    import struct

    fmt = "<2i" if entry.dtype == "I32" else "<2q"
    if len(raw) != struct.calcsize(fmt):
        raise ExecutorError(
            f"{name}: weight_shape is {entry.dtype} {list(entry.shape)}, expected I32 or I64 [2]; "
            "re-download the checkpoint"
        )
    return int(struct.unpack(fmt, raw)[1])


def shard_layouts(
    src: Path,
    plan: ShardPlan,
    *,
    scheme: str,
    exclude: list[str],
    layer_config: dict[str, str] | None,
    drop: frozenset[str],
    decode: Any,
) -> dict[str, ShardLayout]:
    """Every shard's units and output header, from the headers (and, for INT4, the tiny weight_shape tensors)."""
    where: dict[str, Part] = {}
    for shard in plan.shards:
        start, entries = plan.headers[shard]
        for e in entries:
            where[e.name] = Part(shard, e, start + e.begin)
    fmt = getattr(decode, "name", None) if decode is not None else None
    shapes: dict[str, int] = {}
    if fmt == "int4-pack-quantized":
        wanted = [
            p
            for n, p in where.items()
            if n.endswith(".weight_shape") and n[: -len(".weight_shape")] + ".weight_packed" in where
        ]
        for n, raw in _read_small(src, wanted).items():
            shapes[n] = _int4_cols(raw, where[n].entry, n)

    def part(name: str, decoded: str) -> Part:
        p = where.get(name)
        if p is None:
            raise ExecutorError(f"{decoded}: {name} is in no shard of the checkpoint; re-download it")
        return p

    layouts: dict[str, ShardLayout] = {}
    for shard in plan.shards:
        start, entries = plan.headers[shard]
        units: list[Unit] = []
        for e in entries:
            anchor = Part(shard, e, start + e.begin)
            if (
                fmt == "fp8-block"
                and decode.fp4_experts
                and e.dtype in FP4_DTYPES
                and e.name.endswith(".weight")
                and fp8_scale_name(decode, e.name) in where
            ):
                parts = [anchor, part(fp8_scale_name(decode, e.name), e.name)]
                units.append(Unit(e.name, e.dtype, e.shape, "relayout", MXFP4, parts, False, []))
            elif (
                fmt == "fp8-block"
                and e.name.endswith(".weight")
                and (e.dtype in FP8_DTYPES or fp8_scale_name(decode, e.name) in where)
            ):
                parts = [anchor, part(fp8_scale_name(decode, e.name), e.name)]
                units.append(Unit(e.name, "BF16", e.shape, "keep", None, parts, True, []))
            elif (
                fmt == "fp8-block"
                and e.name.endswith(decode.scale_suffix)
                and scaled_weight_of(decode, e.name) in where
            ):
                continue  # decoded with its weight, wherever that is
            elif fmt == "int4-pack-quantized" and e.name.endswith(".weight_packed"):
                module = e.name[: -len(".weight_packed")]
                parts = [
                    anchor,
                    part(module + ".weight_scale", module + ".weight"),
                    part(module + ".weight_shape", module + ".weight"),
                ]
                cols = shapes.get(module + ".weight_shape", e.shape[-1] * 8)
                units.append(Unit(module + ".weight", "BF16", (e.shape[0], cols), "keep", None, parts, True, []))
            elif (
                fmt == "int4-pack-quantized"
                and e.name.endswith((".weight_scale", ".weight_shape"))
                and e.name.rpartition(".")[0] + ".weight_packed" in where
            ):
                continue
            elif fmt == "fused-experts" and (fused := fused_expert_parts(decode, e.name, e.shape)):
                for decoded, expert, fpart, shape in fused:  # one fused [E, ...] tensor: a unit per expert tensor
                    units.append(Unit(decoded, e.dtype, shape, "keep", None, [anchor], True, [], fused=(expert, fpart)))
            else:
                units.append(Unit(e.name, e.dtype, e.shape, "keep", None, [anchor], False, []))
        for u in units:
            _decide(u, plan, scheme, exclude, layer_config, drop)
        layout = ShardLayout(shard, plan.sizes[shard], start, units, entries=list(entries))
        layout.depends_on = sorted({p.shard for u in units for p in u.parts if p.shard != shard})
        _output_header(layout)
        layouts[shard] = layout
    return layouts


def _decide(
    u: Unit, plan: ShardPlan, scheme: str, exclude: list[str], layer_config: dict[str, str] | None, drop: frozenset[str]
) -> None:
    """What Quark's per-shard loop (`_quantize_and_save_safetensor_shard`) does with the tensor, and its outputs."""
    if u.name in drop:
        u.kind = "drop"
        return
    if u.kind == "relayout":
        # Already OCP MXFP4: written as Quark stores MXFP4 whether the plan quantizes it (target experts) or keeps
        # it as stored (an MTP block's experts); plan_apply refuses any other scheme for it ("already FP4").
        rows, packed = u.shape
        target = scheme_for(u.name, (rows, packed * 2), scheme, exclude, layer_config)
        if target not in (None, MXFP4):
            raise ExecutorError(f"{u.name} is already OCP MXFP4 (FP4 experts); it cannot be quantized with {target}")
        scale = u.parts[1].entry.shape
        u.outputs = [OutTensor(u.name, "U8", u.shape), OutTensor(u.name + "_scale", "U8", scale)]
        return
    target = scheme_for(u.name, u.shape, scheme, exclude, layer_config)
    if target is not None:
        u.kind, u.scheme = "quantize", target
        layout = expected_layout(u.shape, target)
        u.outputs = [OutTensor(u.name + suffix, *layout[suffix]) for suffix in ("", "_scale")]
        return
    model = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(plan.model_dtype)
    if (
        is_linear_weight_name(u.name)
        and u.name not in plan.source_floating_excluded
        and u.dtype in _TORCH_FLOAT
        and model is not None
        and u.dtype != model
    ):
        u.kind = "cast"
        u.outputs = [OutTensor(u.name, model, u.shape)]
        return
    u.outputs = [OutTensor(u.name, u.dtype, u.shape)]


def _output_header(layout: ShardLayout) -> None:
    """The output shard's header as `safetensors.torch.save_file(tensors)` writes it: tensors laid out by dtype (the
    Rust enum's order) then name (quantkit.io.safetensors.serialize_safetensors)."""
    outs = [o for u in layout.units for o in u.outputs]
    layout.names = [o.name for o in outs]
    if len(set(layout.names)) != len(layout.names):
        dup = next(n for n in layout.names if layout.names.count(n) > 1)
        raise ExecutorError(
            f"{layout.name}: the output would hold {dup} twice (a source tensor and a quantized "
            "weight's scale share the name); rename the source tensor"
        )
    order = sorted(outs, key=lambda o: (ST_ORDER.index(o.dtype), o.name))
    head, rel = header_bytes([(o.name, o.dtype, o.shape, o.nbytes) for o in order])
    layout.head = head
    layout.offsets = {o.name: len(head) + r for o, r in zip(order, rel, strict=True)}
    layout.out_size = len(head) + sum(o.nbytes for o in outs)


def cut_batches(layout: ShardLayout, max_read: int, decode_on_host: bool) -> None:
    """Cut the shard into batches of consecutive file bytes whose reads (range + side parts) stay within `max_read`
    bytes where the tensors allow: the whole file is covered, header included, so the batches hash it in order."""
    anchors: dict[str, list[Unit]] = {}
    for u in layout.units:
        if u.parts[0].shard == layout.name:
            anchors.setdefault(u.parts[0].entry.name, []).append(u)
    start = layout.data_start
    batches: list[Batch] = []
    cur: Batch | None = None
    for e in layout.entries:
        us = anchors.get(e.name, [])
        side = [p for u in us for p in u.parts[1:]]
        grow = e.end - e.begin + sum(p.nbytes for p in side)
        if cur is not None and cur.units and cur.read_bytes + grow > max_read:
            batches.append(cur)
            cur = None
        if cur is None:
            begin = 0 if not batches else start + e.begin
            cur = Batch(layout.name, len(batches), begin, begin, [], [])
        cur.end = start + e.end
        if us:
            cur.units.extend(us)
            cur.side.extend(side)
    if cur is None:
        cur = Batch(layout.name, 0, 0, layout.size, [], [])
    batches.append(cur)
    batches[-1].end = layout.size
    for b in batches:  # a part inside the batch's own range is read with it, not fetched again
        b.side = [
            p for p in b.side if not (p.shard == b.shard and b.begin <= p.offset and p.offset + p.nbytes <= b.end)
        ]
        b.cost = b.read_bytes + sum(u.host_bytes(decode_on_host) for u in b.units)
    layout.batches = batches


def ratio_out(layouts: dict[str, ShardLayout], decode_on_host: bool) -> float:
    """The largest host bytes in flight per source byte read, over all units (outputs and decoded values)."""
    r = 0.0
    for layout in layouts.values():
        for u in layout.units:
            if u.source_bytes:
                r = max(r, u.host_bytes(decode_on_host) / u.source_bytes)
    return r


@dataclass
class OutputLayout:
    """One output shard of a re-sharded run (`--max-shard-size`): its tensors in the index's order, its header, the
    source shards whose units it takes tensors from (`sources`, with the shards those units fetch parts from)."""

    name: str
    names: list[str]
    head: bytes
    offsets: dict[str, int]
    out_size: int
    outputs: list[OutTensor]
    sources: list[str]
    bytes_in: int = 0  # source bytes of the units whose first output lies here (progress only)


def _entry_bound(o: OutTensor) -> int:
    """An upper bound on the header bytes `header_bytes` spends on `o` (offsets written with 20 digits each)."""
    return len(
        json.dumps(
            {o.name: {"dtype": o.dtype, "shape": list(o.shape), "data_offsets": [10**19, 10**19]}},
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode()
    )


def output_layouts(layouts: dict[str, ShardLayout], shards: list[str], max_shard_size: int) -> list[OutputLayout]:
    """The output tensors of every source shard (in source order, Quark's insertion order within a shard) cut into
    output shards of at most `max_shard_size` bytes each, as transformers' `split_torch_state_dict_into_shards`
    (huggingface_hub `split_state_dict_into_shards_factory`) does: greedy, a new shard when the next tensor would
    tip the current one over, a tensor larger than the limit alone in its own shard. Two differences, on purpose:
    the limit holds for the whole file (header included, counted by an upper bound), not the tensor bytes only; and
    an oversized tensor closes the current shard instead of being set aside, so every output shard holds a run of
    consecutive tensors. Names are HF's `model-00001-of-0000N.safetensors`."""
    groups: list[list[tuple[OutTensor, Unit, str]]] = []
    cur: list[tuple[OutTensor, Unit, str]] = []
    used = 8 + 2 + 7  # length prefix, braces, padding to 8
    for shard in shards:
        for u in layouts[shard].units:
            for o in u.outputs:
                size = o.nbytes + _entry_bound(o) + 1  # +1: the comma between entries
                if cur and used + size > max_shard_size:
                    groups.append(cur)
                    cur, used = [], 8 + 2 + 7
                cur.append((o, u, shard))
                used += size
                if used > max_shard_size:  # alone and still too large: its own shard
                    groups.append(cur)
                    cur, used = [], 8 + 2 + 7
    if cur:
        groups.append(cur)
    out: list[OutputLayout] = []
    n = len(groups)
    for i, group in enumerate(groups):
        outs = [o for o, _, _ in group]
        order = sorted(outs, key=lambda o: (ST_ORDER.index(o.dtype), o.name))
        head, rel = header_bytes([(o.name, o.dtype, o.shape, o.nbytes) for o in order])
        sources = sorted({s for _, u, s in group} | {p.shard for _, u, _ in group for p in u.parts})
        first = {id(u) for o, u, _ in group if o is u.outputs[0]}
        bytes_in = sum(u.source_bytes for u in {id(u): u for _, u, _ in group}.values() if id(u) in first)
        out.append(
            OutputLayout(
                f"model-{i + 1:05d}-of-{n:05d}.safetensors",
                [o.name for o in outs],
                head,
                {o.name: len(head) + r for o, r in zip(order, rel, strict=True)},
                len(head) + sum(o.nbytes for o in outs),
                outs,
                sources,
                bytes_in,
            )
        )
    return out
