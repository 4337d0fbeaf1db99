"""`quantkit bench`: arms served one after another with identical server settings, each measured by vLLM's own
serving benchmark (quantkit.bench.load) at every concurrency, repeated, and compared (quantkit.bench.figures).

The arms, for a target T, its BF16 draft D and candidate drafts Q1..Qn (each arm at every K of `ks`):
- `T` (no speculation), `T+bf16` (D), `T+<Q>` (each candidate);
- with `candidate_target` QT (a quantized target): also `QT`, `QT+bf16` and `QT+<Q>`.
A K sweep (`ks` with several values) names each speculative arm `<arm>@k<K>`; K=0 is the draft served with a
schedule that drafts nothing at every batch size (vLLM 0.32's `num_speculative_tokens_per_batch_size`
[[1, max_num_seqs, 0]], vllm/config/speculative.py), so it runs the speculative path and must match `T` within its
CI.

Every started server (quantkit.engines.vllm_server.VllmServer) gets the same flags: `--no-enable-prefix-caching`
(the cycled prompts would otherwise hit the cache; InferenceX's rule), the same `--max-num-seqs`,
`--max-model-len`, `--tensor-parallel-size`, seed, and on CPU `--enforce-eager`; and it is stopped before the next
arm starts. An arm given an endpoint is measured only: its /v1/models must name the arm's target, and its
/metrics must carry spec-decode counters exactly when the arm has a draft (and /server_info, when the server
exposes it, the arm's draft and K).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.bench.endpoints import (
    BenchError,
    Endpoint,
    EndpointError,
    ModelList,
    ServerInfo,
    echo,
    parse_endpoint,
    validated,
)
from quantkit.bench.figures import compare, crossover, fill_cell, k_schedule, not_paying
from quantkit.bench.identity import NOT_PARSED, RANDOM_LABEL, draft_costs, identity
from quantkit.bench.load import bench_argv, bench_run, run_vllm_bench, write_prompts
from quantkit.errors import QuantkitError
from quantkit.progress import Progress, or_silent
from quantkit.results.bench import ArmKind, BenchArm, BenchCell, BenchResult, BenchSettings

WORKLOADS = {"prompts": None, "random-1k1k": (1024, 1024)}
DEFAULT_GPU_CONCURRENCY = [1, 4, 8, 16, 32, 64]
DEFAULT_CPU_CONCURRENCY = [1, 2, 4]
MAX_ANSWER_BYTES = 32 << 20  # /v1/models, /metrics, /server_info: a vLLM server's are kilobytes


@dataclass(frozen=True)
class ArmSpec:
    name: str
    kind: ArmKind
    target: str
    draft: str | None
    k: int | None
    endpoint: str | None = None  # the URL without credentials (quantkit.bench.endpoints)
    authorization: str | None = None  # the Authorization header carrying the URL's credentials, never shown


def plan_arms(
    target: str,
    draft: str | None,
    candidates: list[str],
    candidate_target: str | None,
    ks: list[int],
    endpoints: dict[str, str] | dict[str, Endpoint] | None = None,
    names: dict[str, str] | None = None,
) -> list[ArmSpec]:
    """The arms in the order they are served (see the module docstring); `names` maps a candidate path to its arm
    label (default: its folder name)."""
    parsed = {
        arm: e if isinstance(e, Endpoint) else parse_endpoint(e, f"--endpoint {echo(arm, 100)}=")
        for arm, e in (endpoints or {}).items()
    }
    names = names or {}
    if candidates and draft is None:
        raise BenchError("--candidate needs --draft: a candidate draft is compared with the BF16 draft it came from")
    arms: list[ArmSpec] = []
    for t, tname in [(target, "target")] + ([(candidate_target, "qtarget")] if candidate_target else []):
        arms.append(ArmSpec(tname, "no-spec", t, None, None))
        bf16: ArmKind = "bf16-draft"
        cand: ArmKind = "candidate"
        drafts: list[tuple[str, str, ArmKind]] = ([(draft, "bf16", bf16)] if draft else []) + [
            (c, names.get(c, Path(c).name), cand) for c in candidates
        ]
        for d, dname, kind in drafts:
            for k in ks:
                suffix = f"@k{k}" if len(ks) > 1 else ""
                arms.append(ArmSpec(f"{tname}+{dname}{suffix}", kind, t, d, k))
    seen = [a.name for a in arms]
    if len(set(seen)) != len(seen):
        raise BenchError(f"two arms share a name ({seen}); give candidates distinct folder names")
    unknown = sorted(set(parsed) - set(seen))
    if unknown:
        raise BenchError(f"--endpoint {echo(unknown[0], 100)}=...: no such arm; the arms are {', '.join(seen)}")
    return [
        ArmSpec(
            a.name,
            a.kind,
            a.target,
            a.draft,
            a.k,
            e.url if (e := parsed.get(a.name)) else None,
            e.authorization if e else None,
        )
        for a in arms
    ]


def prompt_texts(target: str, prompts: str) -> tuple[list[str], int]:
    """The prompt set rendered with the target's chat template (as the acceptance and serve steps send it) and the
    longest prompt in tokens."""
    from quantkit.io.hf import load_tokenizer
    from quantkit.io.prompts import load_prompts

    tokenizer = load_tokenizer(target)
    texts = [r.render(tokenizer) for r in load_prompts(prompts)]
    return texts, max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)


def run_bench(
    target: str | Path,
    draft: str | Path | None = None,
    candidates: list[str | Path] | tuple = (),
    candidate_target: str | Path | None = None,
    *,
    concurrency: list[int] | None = None,
    output_len: int = 64,
    repeats: int = 3,
    ks: list[int] | None = None,
    prompts: str = "builtin",
    workload: str = "prompts",
    endpoints: dict[str, str] | dict[str, Endpoint] | None = None,
    out_dir: str | Path,
    tp: int = 1,
    max_num_seqs: int | None = None,
    fast_start: bool = False,
    startup_timeout_s: float = 600,
    bootstrap_samples: int = 2000,
    temperature: float = 0.0,
    candidate_names: dict[str, str] | None = None,
    extra_server_args: list[str] | None = None,
    speculative_overrides: dict[str, Any] | None = None,
    arms: list[ArmSpec] | None = None,
    max_prompt_texts: int | None = None,
    request_timeout_s: float = 600.0,
    progress: Progress | None = None,
) -> BenchResult:
    """Serve every arm, measure every cell, compare. A cell with a failed request is kept, marked not ok, and left
    out of every comparison; an arm whose server does not come up is kept with its error."""
    from quantkit.engines.platform import is_vllm_cpu

    progress = or_silent(progress)
    t0 = time.perf_counter()
    if workload not in WORKLOADS:
        raise BenchError(f"--workload {workload}: unknown; use one of {', '.join(WORKLOADS)}")
    if repeats < 1:
        raise BenchError(f"--repeats {repeats}: at least 1 (3 or more for a spread)")
    cpu = is_vllm_cpu()
    concurrency = sorted(set(concurrency or (DEFAULT_CPU_CONCURRENCY if cpu else DEFAULT_GPU_CONCURRENCY)))
    ks = list(ks or [3])
    if any(k < 0 for k in ks) or len(set(ks)) != len(ks):
        raise BenchError(f"--k {ks}: distinct values of at least 0")
    target, out = str(target), Path(out_dir)
    arms = arms or plan_arms(
        target,
        str(draft) if draft else None,
        [str(c) for c in candidates],
        str(candidate_target) if candidate_target else None,
        ks,
        endpoints,
        {str(k): v for k, v in (candidate_names or {}).items()},
    )
    ks = sorted({a.k for a in arms if a.k is not None}) or ks
    overrides = dict(speculative_overrides or {})
    out.mkdir(parents=True, exist_ok=True)
    random_shape = WORKLOADS[workload]
    if random_shape is None:
        texts, longest = prompt_texts(target, prompts)
        texts = texts[:max_prompt_texts] if max_prompt_texts else texts
        dataset = f"quantkit prompts: {prompts}"
    else:
        texts, longest = [], random_shape[0]
        output_len = random_shape[1]
        dataset = f"vllm random dataset ({random_shape[0]} in / {random_shape[1]} out, seed 0)"
    max_num_seqs = max_num_seqs or max(concurrency)
    from quantkit.io.checkpoint import resolve_config
    from quantkit.io.config import fit_max_model_len

    max_model_len = fit_max_model_len(resolve_config(target), longest + output_len + max(ks) + 64)
    server_args = (
        ["--no-enable-prefix-caching", "--max-num-seqs", str(max_num_seqs)]
        + (["--tensor-parallel-size", str(tp)] if tp > 1 else [])
        + list(extra_server_args or [])
    )
    sampling: dict[str, float | int | None] = {"temperature": temperature, "seed": 0}
    result = BenchResult(
        identity=identity(
            tp=tp,
            kv_cache_dtype="auto",
            max_num_seqs=max_num_seqs,
            sampling=sampling,
            dataset=dataset,
            dataset_revision=None,
            workload=workload,
            fast_start=fast_start,
        ),
        settings=BenchSettings(
            concurrency=concurrency,
            output_len=output_len,
            repeats=repeats,
            num_warmups="2 x C",
            ks=ks,
            prompts=prompts if random_shape is None else workload,
            num_prompt_texts=len(texts),
            bootstrap_samples=bootstrap_samples,
        ),
        out_dir=str(out),
    )
    if overrides.get("rejection_sample_method") == "synthetic":
        result.identity.synthetic_acceptance = True
    result.draft_costs = draft_costs(
        [a.draft for a in arms if a.kind != "no-spec"], result.identity.gpu_name, tp, ks, result.warnings
    )
    if random_shape is not None:
        result.warnings.append(f"{workload}: {RANDOM_LABEL}")
    for spec in arms:
        arm = BenchArm(
            name=spec.name,
            kind=spec.kind,
            target=spec.target,
            draft=spec.draft,
            num_speculative_tokens=spec.k,
            endpoint=spec.endpoint,
        )
        result.arms.append(arm)
        progress(f"arm {spec.name}: {'endpoint ' + spec.endpoint if spec.endpoint else 'starting vllm serve'}")
        try:
            with _server(
                spec,
                max_num_seqs,
                max_model_len,
                server_args,
                fast_start,
                startup_timeout_s,
                overrides,
                progress,
                request_timeout_s,
                log_dir=out / "server-logs",
            ) as (url, model_name, server):
                if server is not None:
                    arm.command, arm.startup_s = list(server.command), round(server.startup_s or 0.0, 2)
                    arm.server_pid = server.pid
                    arm.speculative_config = _spec_config(server.command)
                for conc in concurrency:
                    cell = measure_cell(
                        spec,
                        url,
                        model_name,
                        texts,
                        conc,
                        output_len,
                        repeats,
                        out,
                        tp,
                        random_input_len=random_shape[0] if random_shape else None,
                        temperature=temperature,
                        request_timeout_s=request_timeout_s,
                        progress=progress,
                    )
                    arm.cells.append(cell)
                if server is not None and server.log_path is not None:
                    arm.backends, arm.backends_reason = backends_of(server.log_path)
                else:
                    arm.backends_reason = "an endpoint: its log is not quantkit's to read"
        except QuantkitError as e:
            arm.error = echo(str(e).splitlines()[0] if str(e) else type(e).__name__)
            progress(f"arm {spec.name}: {arm.error}")
    chosen = {k: v for a in result.arms if a.backends for k, v in a.backends.items()}
    result.identity.backends = chosen or None
    result.identity.backends_reason = (
        "" if chosen else next((a.backends_reason for a in result.arms if a.backends_reason), NOT_PARSED)
    )
    result.comparisons = compare(result.arms, samples=bootstrap_samples)
    for arm in result.arms:
        if arm.kind != "no-spec":
            result.crossover[arm.name] = crossover(result.comparisons, arm.name)
            result.not_paying[arm.name] = not_paying(result.comparisons, arm.name)
    result.k_schedules = schedules(result.arms, max_num_seqs)
    result.warnings += unmeasured_warnings(result.arms, repeats)
    result.seconds = round(time.perf_counter() - t0, 1)
    return result


def unmeasured_warnings(arms: list[BenchArm], repeats: int) -> list[str]:
    """The figures that could not be measured, said once in bench.json's `warnings` (the table and the charts leave
    them out): interactivity from a merged stream's TPOT, and the interval of a single repeat."""
    out = []
    if repeats == 1:
        out.append(
            "--repeats 1: one repeat per cell gives no spread and no confidence interval; each figure is a "
            "single measurement (use 3 or more repeats for intervals)"
        )
    for arm in arms:
        for c in arm.cells:
            if c.ok and c.interactivity is None and c.interactivity_reason:
                out.append(
                    f"arm {arm.name}, C={c.concurrency}: interactivity not measured ({c.interactivity_reason});"
                    " left out of pareto.png and the table"
                )
    return out


def schedules(arms: list[BenchArm], max_num_seqs: int) -> list:
    """One K schedule per (target, draft) measured at more than one K (K=0 included through the no-spec arm of
    that target when the sweep has no K=0 arm of its own)."""
    out = []
    groups: dict[tuple[str, str], list[BenchArm]] = {}
    for a in arms:
        if a.draft is not None:
            groups.setdefault((a.target, a.draft), []).append(a)
    for (t, d), group in groups.items():
        if len(group) < 2:
            continue
        base = next((a for a in arms if a.kind == "no-spec" and a.target == t), None)
        members = group + ([base] if base is not None and not any(a.num_speculative_tokens == 0 for a in group) else [])
        prefix = group[0].name.split("@")[0]
        sched = k_schedule(t, d, prefix, members, max_num_seqs)
        if sched is not None:
            out.append(sched)
    return out


def backends_of(log_path: Path) -> tuple[dict[str, str] | None, str]:
    """The backends a started server chose, from its log (quantkit.engines.server_log): kind -> names."""
    from quantkit.engines.server_log import read_server_log

    try:
        found = read_server_log(log_path)
    except OSError as e:
        return None, f"log unreadable ({e.strerror or e})"
    out = {
        kind: ", ".join(names) for kind in ("moe", "attention", "linear", "kv_cache") if (names := getattr(found, kind))
    }
    return (out, "") if out else (None, "no backend line in the server's log")


def _spec_config(command: list[str]) -> dict[str, Any] | None:
    import json

    if "--speculative-config" not in command:
        return None
    return dict(json.loads(command[command.index("--speculative-config") + 1]))


@contextlib.contextmanager
def _server(
    spec: ArmSpec,
    max_num_seqs: int,
    max_model_len: int,
    server_args: list[str],
    fast_start: bool,
    startup_timeout_s: float,
    spec_overrides: dict[str, Any],
    progress: Progress,
    request_timeout_s: float = 600.0,
    log_dir: Path | None = None,
):
    """(base url, served model name, the VllmServer or None) for one arm: an endpoint checked against the arm, or
    a server started here and always stopped; its `vllm serve` log is kept in `log_dir` (named in its errors)."""
    if spec.endpoint is not None:
        name = verify_endpoint(spec, timeout_s=min(request_timeout_s, 30.0))
        yield spec.endpoint.rstrip("/"), name, None
        return
    from quantkit.engines.vllm_server import SERVED_MODEL_NAME, VllmServer

    overrides = dict(spec_overrides) if spec.draft is not None else {}
    k = spec.k
    if spec.draft is not None and k == 0:
        # nothing drafted at any batch size, through the speculative path (vllm/config/speculative.py
        # num_speculative_tokens_per_batch_size; a K of 0 is allowed inside the schedule,
        # vllm/v1/spec_decode/dynamic/utils.py validate_and_normalize_dynamic_sd_schedule)
        overrides["num_speculative_tokens_per_batch_size"] = [[1, max_num_seqs, 0]]
        k = 1
    with VllmServer(
        spec.target,
        spec.draft,
        k or 3,
        max_model_len=max_model_len,
        extra_args=server_args,
        fast_start=fast_start,
        startup_timeout_s=startup_timeout_s,
        speculative_overrides=overrides,
        progress=progress,
        log_dir=log_dir,
    ) as server:
        yield server.url, SERVED_MODEL_NAME, server


def verify_endpoint(spec: ArmSpec, timeout_s: float = 10.0) -> str:
    """The served model name at `spec.endpoint`, after checking that the server serves what the arm claims.

    Every answer is validated (quantkit.bench.endpoints) and a redirect is refused: an arm measures the server it
    names, not one whose /v1/models and /metrics were never read. Whatever goes wrong is one BenchError line, the
    server's own words cut to 600 characters."""
    import httpx

    from quantkit.engines.vllm_server import parse_prometheus

    url = (spec.endpoint or "").rstrip("/")
    where = f"--endpoint {echo(spec.name, 100)}={echo(url, 200)}"
    headers = {"Authorization": spec.authorization} if spec.authorization else {}

    deadline = time.monotonic() + 6 * timeout_s

    def get(client: httpx.Client, path: str, **params: str) -> httpx.Response:
        """The answer to GET `path`, its body read up to MAX_ANSWER_BYTES and within the deadline: an endpoint that
        answers forever, or gigabytes, is refused, not read into memory."""
        with client.stream("GET", f"{url}{path}", params=params or None) as r:
            if r.is_redirect:
                raise EndpointError(
                    f"{where}: {path} answers {r.status_code}, a redirect to "
                    f"{echo(r.headers.get('location', '?'), 200)}; quantkit measures only the server "
                    "it is given: pass the URL the server really answers on"
                )
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > MAX_ANSWER_BYTES or time.monotonic() > deadline:
                    raise EndpointError(
                        f"{where}: {path} answered more than {MAX_ANSWER_BYTES >> 20} MB or for "
                        f"longer than {6 * timeout_s:g} s; not a vLLM server's answer"
                    )
        # the body is decoded already (iter_bytes): keep only the content type, not the content encoding
        return httpx.Response(
            r.status_code, headers={"content-type": r.headers.get("content-type", "")}, content=bytes(body)
        )

    def json_of(r: httpx.Response, path: str) -> object:
        if r.status_code != 200:
            raise EndpointError(
                f"{where}: {path} answered HTTP {r.status_code} ({echo(r.text, 200)}); is it a "
                "running vLLM server (with its API key or credentials)?"
            )
        try:
            return r.json()
        except ValueError:
            raise EndpointError(
                f"{where}: {path} answered something that is not JSON ({echo(r.text, 120)}); is it a "
                "running vLLM server?"
            ) from None

    try:
        with httpx.Client(timeout=timeout_s, headers=headers, follow_redirects=False) as client:
            models = validated(ModelList, json_of(get(client, "/v1/models"), "/v1/models"), f"{where}: /v1/models")
            metrics = get(client, "/metrics")
            if metrics.status_code != 200:
                raise EndpointError(
                    f"{where}: /metrics answered HTTP {metrics.status_code}; bench reads vLLM's "
                    "Prometheus counters there: point the arm at a vLLM server"
                )
            has_spec = any(m.startswith("vllm:spec_decode") for m in parse_prometheus(metrics.text))
            info = get(client, "/server_info", config_format="json")
            server_info = (
                validated(ServerInfo, json_of(info, "/server_info"), f"{where}: /server_info")
                if info.status_code == 200
                else None
            )
    except (httpx.HTTPError, httpx.InvalidURL, UnicodeError) as e:
        raise EndpointError(
            f"{where}: cannot read /v1/models and /metrics ({type(e).__name__}: {echo(e, 200)}); is "
            "it a running vLLM server?"
        ) from None
    if not models.data:
        raise EndpointError(f"{where}: /v1/models lists no model")
    roots = [m.root or m.id for m in models.data]
    if not any(_same_model(r, spec.target) for r in roots):
        raise EndpointError(
            f"{where}: serves {echo(roots[0], 200)}, not the arm's target {spec.target}; point the "
            "arm at the server of that model"
        )
    if has_spec != (spec.draft is not None):
        raise EndpointError(
            f"{where}: the server {'has' if has_spec else 'has no'} speculative decoding, the arm "
            f"{'has a draft' if spec.draft else 'has none'}; start it "
            f"{'with' if spec.draft else 'without'} --speculative-config"
        )
    sc = server_info.vllm_config.speculative_config if server_info and server_info.vllm_config else None
    if sc is not None and spec.draft is not None:
        if not _same_model(str(sc.model), spec.draft) or (spec.k and sc.num_speculative_tokens != spec.k):
            raise EndpointError(
                f"{where}: speculative config is {echo(sc.model, 200)} with K "
                f"{sc.num_speculative_tokens}, the arm claims {spec.draft} with K {spec.k}"
            )
    name = models.data[0].id
    if len(name) > 1000 or any(ord(c) < 32 for c in name):
        raise EndpointError(
            f"{where}: /v1/models names a model id of {len(name)} characters or with control "
            f"characters ({echo(name, 80)}); not a model a vLLM server serves"
        )
    return name


def _same_model(served: str, claimed: str) -> bool:
    """A served path or Hub id against the arm's: equal, or the same folder once resolved."""
    if served == claimed:
        return True
    with contextlib.suppress(OSError, ValueError):
        return Path(served).resolve() == Path(claimed).resolve()
    return False


def measure_cell(
    spec: ArmSpec,
    url: str,
    model_name: str,
    texts: list[str],
    conc: int,
    output_len: int,
    repeats: int,
    out: Path,
    tp: int,
    *,
    random_input_len: int | None = None,
    temperature: float = 0.0,
    request_timeout_s: float = 600.0,
    progress: Progress | None = None,
) -> BenchCell:
    """`repeats` runs of vLLM's serving benchmark at concurrency `conc` (after 2 x C warm-ups each).

    A run that vLLM's client cannot finish, or whose figures are not a serving benchmark's (NaN, infinities, wrong
    types: what a broken server's usage gives), fails this cell with one line; the other cells still run."""
    progress = or_silent(progress)
    num_prompts = max(10 * conc, len(texts))
    folder = out / spec.name.replace("+", "_").replace("@", "_")
    folder.mkdir(parents=True, exist_ok=True)
    dataset = folder / f"prompts-c{conc}.jsonl"
    digest = write_prompts(dataset, texts, num_prompts) if texts else f"random-{random_input_len}-seed0"
    cell = BenchCell(concurrency=conc, num_prompts=num_prompts, output_len=output_len)
    for r in range(repeats):
        argv = bench_argv(
            base_url=url,
            model=spec.target,
            served_model_name=model_name,
            tokenizer=spec.target,
            dataset_path=dataset,
            num_prompts=num_prompts,
            concurrency=conc,
            output_len=output_len,
            num_warmups=2 * conc,
            temperature=temperature,
            random_input_len=random_input_len,
            headers={"Authorization": spec.authorization} if spec.authorization else None,
        )
        try:
            raw = run_vllm_bench(argv, request_timeout_s=request_timeout_s)
            run = bench_run(raw, digest, folder / f"c{conc}-r{r}.json")
        except KeyboardInterrupt:
            raise
        except Exception as e:  # vLLM's client raises plain exceptions (a refused first request, a dead server)
            why = (
                e.reason
                if isinstance(e, QuantkitError) and e.reason
                else f"vLLM's benchmark client failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            )
            cell.problems.append(echo(f"repeat {r}: {why}"))
            progress(f"arm {spec.name}, C={conc}: FAILED ({echo(why, 300)})")
            break
        cell.repeats.append(run)
        progress(
            f"arm {spec.name}, C={conc}, repeat {r + 1}/{repeats}: {run.output_throughput or 0:.1f} tok/s, "
            f"TPOT p50 {run.p50_tpot_ms or 0:.1f} ms"
            + (f", AL {run.spec_decode_acceptance_length:.3f}" if run.spec_decode_acceptance_length else "")
        )
    failed = list(cell.problems)
    cell = fill_cell(cell, tp)
    if failed:
        cell.problems, cell.ok = failed + cell.problems, False
    elif not cell.ok:
        progress(f"arm {spec.name}, C={conc}: FAILED ({echo(cell.problems[0] if cell.problems else 'no repeat', 300)})")
    return cell
