"""A job's full description: every `gemma-batch run` flag, from the command line or a TOML job
file (job_file.py), checked (`make_spec`). Flags given on the command line override the file.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..backends import BACKENDS
from ..backends.kv_formats import KV_DTYPES
from ..model.quant import FORMATS, INT4_GROUPS, WeightFormat
from ..engine.constraints import Constraint, check_grammar
from ..engine.sampling_params import SamplingParams
from ..model.checkpoint import DEMO_MODEL

DATE = "{date}"  # the placeholder an output name may carry (`--output "labels-{date}.parquet"`)

PATH_FIELDS = ("input", "output", "output_dir", "model", "json_schema")
LIST_FIELDS = ("keep_columns", "stop", "choices")


class UsageError(ValueError):
    """A bad flag, TOML key or value: the job does not start (exit code 2)."""


@dataclass(frozen=True)
class JobSpec:
    input: Path
    output: Path | None = None  # None: derived from the input's name
    output_dir: Path | None = None  # instead of one file, a folder of Parquet parts (output format "parquet-dir")
    model: Path = DEMO_MODEL
    backend: str = "auto"
    device: str | None = None  # Vulkan device: index or part of its name (`gemma-batch devices`)
    place: str | None = None  # a placement plan (backends/placement.py) or "auto"; None: auto under --backend auto
    gpu_memory: str | None = None  # the most memory the job may plan to use on a GPU ("6GiB"); None: what is free
    weights: str = "auto"  # weight format (model.quant.FORMATS), converted at load and cached
    int4_group: int = 32  # weights per int4 scale
    kv_dtype: str | None = None  # KV cache storage (backends.kv_formats); None: the backend's default
    prompt_column: str = "prompt"
    id_column: str | None = None  # None: "id" when present, else the row number
    keep_columns: tuple[str, ...] = ()
    chat: bool | None = None  # None: chat template for `messages` rows only
    output_format: Literal["parquet", "openai", "jsonl", "csv", "parquet-dir"] | None = None  # None: from the output's name (`resolve_output_format`)
    max_tokens: int = SamplingParams.max_tokens  # the sampling defaults are SamplingParams'
    temperature: float = SamplingParams.temperature
    top_k: int = SamplingParams.top_k
    top_p: float = SamplingParams.top_p
    min_p: float = SamplingParams.min_p
    seed: int = SamplingParams.seed
    stop: tuple[str, ...] = SamplingParams.stop
    logprobs: int | None = SamplingParams.logprobs  # report K alternatives per generated token
    regex: str | None = None  # every completion matches it whole (a row's `regex` column overrides)
    json_schema: Path | None = None  # a JSON schema file every completion's JSON validates against
    json: bool = False  # every completion is a JSON object
    choices: tuple[str, ...] = ()  # every row answers with one of these, scored (a row's `choices` overrides them)
    score_only: bool = False  # rows get their choices' probabilities only: no completion
    max_batch: int = 32
    max_model_len: int | None = None  # None: the model's context
    kv_memory: str = "50%"  # bytes ("4GiB", "512MB") or a share of the backend's free memory ("50%")
    block_size: int = 16
    max_step_tokens: int | None = None  # None: the backend's (Backend.default_step_tokens)
    prefix_cache: bool = True  # reuse the K/V of prompt starts rows share (engine/kv_cache.py)
    force: bool = False
    input_renamed: bool = False  # the output was written from another input file that this one replaces
    fail_on_row_error: bool = False
    ray: bool = False  # run on a Ray cluster's workers (ray_data/job.py)
    ray_address: str | None = None  # the cluster ("auto": the one `ray start` made here); None: RAY_ADDRESS's, else a new one here
    workers: int | None = None  # Ray workers; None: one per GPU of the cluster, else one per machine

    @property
    def output_path(self) -> Path:
        """The output file: --output (its {date} replaced by today's, YYYY-MM-DD), or named after
        the whole input name, so that no two inputs share one (data.jsonl ->
        data.jsonl.completions.parquet, data.parquet -> data.parquet.completions.parquet)."""
        if self.output is not None or self.output_dir is not None:
            return Path(str(self.output or self.output_dir).replace(DATE, datetime.date.today().isoformat()))
        suffix = ".results.jsonl" if self.output_format == "openai" else f".completions.{self.output_format or 'parquet'}"
        return self.input.with_name(self.input.name + suffix)

    @property
    def input_file(self) -> str:
        """The input as seen from the output's folder (symbolic links not followed): what an
        output records as the file it was written from, unchanged when both move together."""
        return os.path.relpath(os.path.abspath(self.input), os.path.abspath(self.output_path.parent))

    @property
    def weight_format(self) -> WeightFormat:
        return WeightFormat.parse(self.weights, self.int4_group)

    @functools.cached_property
    def constraint(self) -> Constraint | None:
        """The rows' constraint from --regex, --json-schema or --json (checked by `make_spec`; the
        schema file read once)."""
        if self.regex is not None:
            return Constraint("regex", self.regex)
        if self.json_schema is not None:
            try:
                text = self.json_schema.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise UsageError(f"--json-schema {self.json_schema}: cannot read it ({e})") from None
            try:
                return Constraint.json_schema(text)
            except ValueError as e:
                raise UsageError(f"--json-schema {self.json_schema}: {e}") from None
        return Constraint("json") if self.json else None

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(
            self.max_tokens, self.temperature, self.top_k, self.top_p, self.min_p, self.seed, self.stop, self.logprobs
        )


def parse_size(text: str, available: int, flag: str = "--kv-memory") -> int:
    """Bytes from "4GiB", "512MB", "1.5G" (binary), "123456" or "40%" (of `available`)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%|[kKmMgGtT]i?[bB]?|[bB])?\s*", text)
    if not m:
        raise UsageError(f"{flag} {text!r}: expected a size like 4GiB, 512MB or 50%")
    value, unit = float(m.group(1)), m.group(2) or ""
    if unit == "%":
        if not 0 < value <= 100:
            raise UsageError(f"{flag} {text!r}: a share must be in (0, 100]%")
        return int(available * value / 100)
    power = "bkmgt".index(unit[0].lower()) if unit else 0
    base = 1000 if unit.lower().endswith("b") and "i" not in unit and power else 1024
    return int(value * base**power)


def check_paths(spec: JobSpec) -> None:
    """The input exists, the output's folder exists, and the output would not overwrite the input."""
    if not spec.input.exists():
        raise UsageError(f"input {spec.input} does not exist")
    named = spec.output or spec.output_dir
    if named is not None and ("{" in named.name.replace(DATE, "") or "}" in named.name.replace(DATE, "")):
        flag = "--output" if spec.output is not None else "--output-dir"
        raise UsageError(f"{flag} {named}: the only placeholder an output name may hold is {DATE}")
    if spec.output_dir is not None and spec.output_path.exists() and not spec.output_path.is_dir():
        raise UsageError(f"--output-dir {spec.output_path} is a file; --output writes one file")
    output = spec.output_path
    if not output.parent.is_dir():
        raise UsageError(f"output folder {output.parent} does not exist")
    if output.resolve() == spec.input.resolve():
        raise UsageError(f"output {output} is the input file; choose another --output")


_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "str": (str,), "bool": (bool,),
}


def _check_type(key: str, value: Any, where: str) -> None:
    """Refuse a value of the wrong type (a TOML string for a number, a bool for an int...)."""
    if key in LIST_FIELDS and not all(isinstance(v, str) for v in value):
        raise UsageError(f"{where}: {key.replace('_', '-')} must be strings, got {value!r}")
    annotation = str(JobSpec.__dataclass_fields__[key].type)
    kind = next((k for k in ("bool", "float", "int", "str") if annotation.startswith(k)), None)
    ok = kind is None or isinstance(value, _TYPES[kind]) and (kind == "bool" or not isinstance(value, bool))
    if not ok:
        raise UsageError(f"{where}: {key.replace('_', '-')} must be {kind}, got {value!r}")


def make_spec(settings: Mapping[str, Any], where: str = "command line") -> JobSpec:
    """A checked JobSpec from field values (None = not given, use the default)."""
    fields = {f.name: f for f in dataclasses.fields(JobSpec)}
    unknown = sorted(set(settings) - set(fields))
    if unknown:
        raise UsageError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(fields)}")
    values = {k: v for k, v in settings.items() if v is not None}
    if isinstance(values.get("choices"), str):  # "positive,negative": labels between commas
        values["choices"] = tuple(label.strip() for label in values["choices"].split(","))
    for key in LIST_FIELDS:
        if isinstance(values.get(key), str):
            values[key] = (values[key],)
        if key in values:
            values[key] = tuple(values[key])
    for key in PATH_FIELDS:
        if key in values:
            values[key] = Path(values[key])
    for key, value in values.items():
        _check_type(key, value, where)
    try:
        spec = JobSpec(**values)
        spec.sampling  # validates the sampling values
    except (TypeError, ValueError) as e:
        message = str(e)
        for name in fields:  # SamplingParams names its fields: name the flags
            if message.startswith(f"{name} "):
                message = f"--{name.replace('_', '-')}{message[len(name):]}"
        raise UsageError(f"{where}: {message}") from None
    default = JobSpec(input=spec.input)
    checks = [
        (spec.backend in ("auto", *BACKENDS), f"--backend {spec.backend!r}: expected auto, {', '.join(BACKENDS)}"),
        (spec.device is None or spec.backend != "cpu", "--device picks a Vulkan device; it does not go with --backend cpu"),
        (spec.place in (None, "auto") or (spec.backend == "auto" and spec.device is None),
         "--place names the devices itself; leave out --backend and --device"),
        (spec.place != "auto" or spec.backend == "auto", "--place auto chooses among the devices; leave out --backend"),
        (spec.max_batch >= 1, f"--max-batch {spec.max_batch}: must be >= 1 (default {default.max_batch})"),
        (spec.block_size >= 1, f"--block-size {spec.block_size}: must be >= 1 (default {default.block_size})"),
        (spec.max_step_tokens is None or spec.max_step_tokens >= spec.max_batch,
         f"--max-step-tokens {spec.max_step_tokens}: must be at least --max-batch ({spec.max_batch}; default "
         f"{default.max_batch}), or leave it out for the backend's"),
        (spec.max_model_len is None or spec.max_model_len >= 2, f"--max-model-len {spec.max_model_len}: must be >= 2"),
        (spec.ray or (spec.ray_address is None and spec.workers is None), "--ray-address and --workers go with --ray"),
        (spec.workers is None or spec.workers >= 1, f"--workers {spec.workers}: must be >= 1"),
        (not spec.ray or spec.place in (None, "auto"),
         "--ray runs a whole model on each worker's device; --place splits one model across devices: give one"),
        (spec.weights in FORMATS, f"--weights {spec.weights!r}: expected one of {', '.join(FORMATS)} (default {default.weights})"),
        (spec.int4_group in INT4_GROUPS,
         f"--int4-group {spec.int4_group}: expected one of {', '.join(map(str, INT4_GROUPS))} (default {default.int4_group})"),
        (spec.kv_dtype in (None, *KV_DTYPES), f"--kv-dtype {spec.kv_dtype!r}: expected one of {', '.join(KV_DTYPES)}"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(f"{where}: {message}")
    if spec.gpu_memory is not None and (spec.gpu_memory.strip().endswith("%") or parse_size(spec.gpu_memory, 0, "--gpu-memory") <= 0):
        raise UsageError(f"{where}: --gpu-memory {spec.gpu_memory!r}: expected a size like 6GiB")
    constraint = _checked_constraint(spec, where)
    if spec.score_only and constraint is not None:
        raise UsageError(f"{where}: --score-only scores choices; --{constraint.kind.replace('_', '-')} constrains "
                         "generated text: give one")
    if spec.score_only and spec.output_format == "openai":
        raise UsageError(f"{where}: --score-only writes `choice_logprobs`, which OpenAI result lines do not have; "
                         "write Parquet, JSONL or CSV")
    if spec.output_dir is not None:
        if spec.output is not None or spec.output_format not in (None, "parquet-dir"):
            raise UsageError(f"{where}: --output-dir writes a folder of Parquet parts; leave out --output and --output-format")
        return dataclasses.replace(spec, output_format="parquet-dir")
    return dataclasses.replace(spec, output_format=resolve_output_format(spec.output, spec.output_format, where))


def _checked_constraint(spec: JobSpec, where: str) -> Constraint | None:
    """The job's constraint, refused (UsageError) when more than one flag gives one, the regex is
    empty, or the grammar does not compile."""
    given = [f"--{name.replace('_', '-')}" for name in ("regex", "json_schema", "json", "choices") if getattr(spec, name)]
    if len(given) > 1:
        raise UsageError(f"{where}: {' and '.join(given)}: give one constraint")
    if spec.regex == "":
        raise UsageError(f"{where}: --regex is empty")
    if spec.choices and (len(spec.choices) < 2 or not all(spec.choices) or len(set(spec.choices)) < len(spec.choices)):
        raise UsageError(f"{where}: --choices {','.join(spec.choices)!r}: give at least two different, non-empty labels")
    try:
        constraint = spec.constraint
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
    try:
        if constraint is not None:
            check_grammar(constraint)
    except ValueError as e:
        raise UsageError(f"{where}: {given[0]}: {e}") from None
    return constraint


OUTPUT_SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".csv": "csv"}


def resolve_output_format(output: Path | None, given: str | None, where: str = "command line") -> str:
    """The output format: --output-format if given (openai: OpenAI Batch result lines, in a .jsonl
    file), else the output name's extension (.parquet, .jsonl, .csv), else parquet; a name whose
    extension says another format, or none of them, is a UsageError."""
    known = ("parquet", "openai", *OUTPUT_SUFFIXES.values())
    if given is not None and given not in known:
        raise UsageError(f"{where}: output format {given!r}: expected one of {', '.join(dict.fromkeys(known))}")
    if output is None:
        return given or "parquet"
    named = OUTPUT_SUFFIXES.get(output.suffix.lower())
    if given is None and named is None:
        raise UsageError(f"{where}: --output {output}: its extension sets the format: .parquet, .jsonl or .csv "
                         "(--output-format openai writes OpenAI Batch results to a .jsonl name)")
    if given is not None and named != ("jsonl" if given == "openai" else given):
        raise UsageError(f"{where}: --output {output}: --output-format {given} writes a "
                         f"{'.jsonl' if given == 'openai' else '.' + given} file")
    return given or named
