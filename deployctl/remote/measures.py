"""The protocol's types of what is measured on a host and kept there (stdlib only, types
only): a bench level and the kept sweeps, the tune record. `protocol` declares the calls that
carry them; the client, the views, the HTML report and the dashboard read these keys.

Split from protocol.py by concern (each module of deployctl/remote/ stays under 600 lines).
"""

from __future__ import annotations

from typing import Any, TypedDict

# The load generator runs here, on the server's own host: the network and the bind address
# then do not matter, and the metric definitions live in one place.


class BenchArgs(TypedDict):
    bind_host: str
    port: int
    concurrency: int
    prompts: int
    input_len: int
    output_len: int
    flush: bool
    timeout: float
    tool: str  # "builtin" (this agent's generator) or "sglang" (SGLang's serving benchmark)
    env: dict[str, str]  # the run's own variables (HF_HOME, …): the sglang tool runs with them
    warmup: bool  # a warm-up at the level's concurrency first, not counted
    client_processes: int  # builtin: the processes the streams are spread over; 0: as many as fit


class Spread(TypedDict):
    p50: float | None
    p99: float | None


class BenchLevelMore(TypedDict, total=False):
    # Kept levels from before these keys lack them (a kept sweep or tune record is not refused
    # for it). The agent gives the first three; the client works out the others from them.
    warmup_s: float | None  # the warm-up's seconds; None: no warm-up before this level
    first_sample_tokens_per_s: float | None  # the warm-up's first requests, one a stream
    rounds_tokens_per_s: list[float]  # each round of the streams' throughput, in order
    first_sample_bias: float | None  # first sample ÷ the level's throughput - 1
    spread: float | None  # the 95 % CI half-width of the rounds' mean ÷ it; None: < 2 rounds
    drift: float | None  # (mean of the rounds' second half - first half's) ÷ their mean
    drifting: bool  # |drift| > spread: the level's samples still move
    client_processes: int  # builtin: the processes its streams were spread over
    client_busy: float  # builtin: the busiest client process's CPU ÷ wall seconds


class BenchLevel(BenchLevelMore):
    concurrency: int
    prompts: int
    completed: int
    failed: int
    errors: list[str]  # the first few
    duration_s: float
    output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    ttft_ms: Spread
    itl_ms: Spread  # builtin: gaps between streamed chunks (bench_serving's OpenAI backends);
    # sglang: per token, a chunk's gap divided by the tokens it brought (its native backend)
    e2e_ms: Spread


class BenchSaveArgs(TypedDict):
    state_dir: str
    run: str
    result: dict[str, Any]


class BenchSaveReply(TypedDict):
    path: str


class BenchResultsArgs(TypedDict):
    state_dir: str
    runs: list[str]


class BenchResultsReply(TypedDict):
    results: dict[str, list[dict[str, Any]]]  # run id → its bench results, oldest first
    unreadable: list[str]  # kept files that are not JSON or not a sweep: skipped


class TuneSaveArgs(TypedDict):
    state_dir: str
    record: TuneRecord


class TuneSaveReply(TypedDict):
    number: int
    path: str


class TuneRecordsArgs(TypedDict):
    state_dir: str
    number: int | None  # None: the newest
    deployment: str | None


class TuneRecordsReply(TypedDict):
    record: TuneRecord | None
    numbers: list[int]  # every kept tune of the deployment, oldest first
    unreadable: list[str]


# ---- the tune record: tunes/<n>.json on the host, and `tune --json`'s entry ---------------
# Its keys are read by views.py, present/tune_report.py, plot.py and the dashboard's app.js;
# the host (records.is_tune_record) and the client (agent.shape_problems) check a kept one
# against these declarations, and tune.json's `record` is generated from them (tools/contract.py).


class Crossover(TypedDict):
    last_win: int | None  # the last level where speculation wins before its first non-win
    first_loss: int | None  # that first non-win; None: it wins at every level measured


class PhaseRecordBase(TypedDict):
    """One phase's server (baseline, speculative, tuned) and what it measured."""

    run: str | None  # its latest run
    runs: list[str]  # one per visit of its server (the search comes back to it)
    template: str
    threshold: int | None
    state: str
    levels: list[BenchLevel]  # one per concurrency: the median sample
    samples: dict[str, list[float]]  # concurrency → every output tok/s measured there
    sweeps: list[str]  # its kept bench files on the host


class LevelFigures(TypedDict):
    """How one phase measured one level: warm, and how steady its rounds were."""

    warmup_s: float | None  # the warm-ups at this level on the phase's servers; None: none
    first_sample_bias: float | None  # the first warm-up's sample ÷ the level's median - 1
    spread: float | None  # 95 % CI half-width of all its rounds' mean ÷ it; None: < 2 rounds
    drift: float | None  # (their second half's mean - their first half's) ÷ their mean
    drifting: bool  # |drift| > spread
    rounds: int


class PhaseRecord(PhaseRecordBase, total=False):
    per_level: dict[str, LevelFigures]  # concurrency → its figures (records before: none)


class VerdictBase(TypedDict):
    verdict: str  # win, loss or tie
    baseline: float  # median output tok/s
    speculative: float
    spread: dict[str, float]  # phase → its samples' range ÷ their median
    samples: dict[str, int]  # phase → how many


class Verdict(VerdictBase, total=False):
    # Records before these keys lack them.
    level_spread: dict[str, float | None]  # phase → LevelFigures.spread
    within_spread: bool  # the two spreads together exceed |speculative ÷ baseline - 1|


class ObjectiveShown(TypedDict):
    kind: str  # throughput, max_itl_ms or max_ttft_ms
    bound: float | None


class TuneParamsBase(TypedDict):
    """What the tune was asked to measure and how it decided (also `tune --dry-run`'s)."""

    concurrency: list[int]
    input_len: int
    output_len: int
    requests_per_stream: int
    objective: ObjectiveShown
    keep: str
    min_ratio: float
    noise: float
    repeats: int


class TuneParams(TuneParamsBase, total=False):
    warmup: bool  # each level warmed up on each server before it was measured (records before: no)


class CrashRecord(TypedDict):
    """One distinct crash found in a log, explained by the catalog signature it matched."""

    exception: str
    message: str
    file: str | None
    line: int | None
    function: str | None
    ranks: list[str]
    signature: str
    title: str
    hint: str
    log_line: int


class TuneRecordMore(TypedDict, total=False):
    # Readers do without these: a kept record is not refused for lacking one (tune.json
    # does not require them).
    speculation: str  # never, always, up_to, or ""
    crossover: Crossover | None  # None: nothing compared
    narrowed: bool | None  # the bracket's ends are adjacent levels; None: nothing compared
    wins_again: list[int]  # levels above the first non-win where speculation wins again
    verdicts: dict[str, Verdict]  # concurrency → speculation against the baseline there
    capacity: int | None  # with a latency bound: the highest tuned level meeting it
    serving_known: bool  # False: the host did not answer when tune last asked
    previous: str | None  # the run serving before the tune
    crash: CrashRecord | None
    patches: list[str]  # sets tune applied for T
    params: TuneParams
    started_at: float
    wall_s: float


class TuneRecord(TuneRecordMore):
    """One tune of one deployment. A kept record lacking one of these keys, or with a value
    of another type, is named as unreadable and skipped."""

    host: str
    deployment: str | None
    tune: int | None  # its number on the host; None before it is kept
    outcome: str  # tuned, crashed, failed or interrupted
    outcome_note: str
    threshold: int | None  # T; None when speculation never wins or always does
    threshold_mode: str  # patch or adaptive
    phases: dict[str, PhaseRecord]  # by phase name
    refined_levels: list[int]  # measured to find the crossover
    envelope_ratio: dict[str, float]  # concurrency → tuned ÷ the better of the two curves
    min_ratio: float
    held: bool
    serving: str | None
    launches: int
    levels_measured: int


# ---- the canary record: canaries/<n>.json on the router's host, `canary --report`'s ------------
# Written when the judging starts, updated while it runs (state "running"), and once more at the
# end; the host (records.cmd_canary_records) and the client check a kept one against these.


class CanaryBucket(TypedDict):
    bucket: int  # running requests, rounded up to a CUDA-graph batch size
    control_n: int
    candidate_n: int
    control: float | None  # the side's central value, in the metric's units
    candidate: float | None
    ratio: float | None  # candidate / control, above 1 worse


class CanaryStep(TypedDict):
    """One replacement the canary made: the split, then the rollback or the promotion."""

    step: str  # split, rollback or promotion
    unit: str
    outcome: str
    old_run: str | None
    new_run: str | None
    error: str | None


class CanaryRecord(TypedDict):
    """One canary of one router. A kept record lacking one of these keys, or with a value of
    another type, is named as unreadable and skipped."""

    canary: int | None  # its number on the router's host; None before it is kept
    router: str  # host/deployment
    state: str  # running or done
    started_at: float
    updated_at: float
    candidates: list[str]
    controls: list[str]
    metric: str
    max_regression: float
    confidence: float
    verdict: str | None  # regression, no_regression, undecided
    estimate: float | None
    low: float | None
    high: float | None
    samples: int
    buckets: list[CanaryBucket]
    reason: str
    decision: str | None  # promoted, rolled back, kept, failed; None while running
    elapsed_s: float
    interrupted: bool
    steps: list[CanaryStep]


class CanaryKeepArgs(TypedDict):
    state_dir: str
    number: int | None  # None: keep it as the next number; else update that running record
    record: CanaryRecord


class CanaryKeepReply(TypedDict):
    number: int
    path: str


class CanaryRecordsArgs(TypedDict):
    state_dir: str
    router: str  # host/deployment
    number: int | None  # None: the newest


class CanaryRecordsReply(TypedDict):
    record: CanaryRecord | None
    numbers: list[int]  # every kept canary of the router, oldest first
    unreadable: list[str]


# ---- the live window's record: tune-live/<n>.json on the router's host ---------------------------
# Kept when the window starts, brought up to date while it samples (state "running"), and
# finished at its end; `tune --live --report` re-judges its samples, `--resume` adds to them.


class LiveSample(TypedDict):
    side: str  # speculative or plain
    running: float  # the replica's mean running requests over the sample's span
    value: float  # output tok/s per running request
    requests: int  # requests finished in the span
    source: str  # the replica: serial correlation is measured per replica


class EndLook(TypedDict):
    """How a window that ended judged its buckets: a report of it shows that look again."""

    always_valid: bool  # the always-valid intervals (a window that looked every round)
    error_share: float  # the share of the error rate its end look spent


class LiveRecordMore(TypedDict, total=False):
    # Absent in a record kept before windows said them (total=False: NotRequired is not seen
    # under postponed annotations on 3.11, which the host side runs).
    sizes: list[int]  # the decode CUDA-graph sizes the samples are bucketed by
    end_look: EndLook  # a window that ended, since records keep it


class LiveRecord(LiveRecordMore):
    """One live window of one router (with the windows it resumed, their samples)."""

    window: int | None  # its number on the router's host; None before it is kept
    router: str  # host/deployment
    state: str  # running or done
    started_at: float
    updated_at: float
    speculative: str  # the replicas compared
    plain: str
    confidence: float
    resumed: list[int]  # the windows whose samples it started from, oldest first
    samples: list[LiveSample]
    decision: str | None  # promoted, reported, failed, interrupted; None while running
    threshold: int | None  # the crossover's T at the end
    elapsed_s: float  # this window's sampling, and the resumed ones'


class LiveKeepArgs(TypedDict):
    state_dir: str
    number: int | None  # None: keep it as the next number; else update that running record
    record: LiveRecord


class LiveRecordsArgs(TypedDict):
    state_dir: str
    router: str  # host/deployment
    number: int | None  # None: the newest


class LiveRecordsReply(TypedDict):
    record: LiveRecord | None
    numbers: list[int]  # every kept window of the router, oldest first
    unreadable: list[str]


# ---- what a kept agent costs (remote/kept_agent.py: its `echo` call) ------------------------


class EchoArgs(TypedDict):
    pass


class EchoReply(TypedDict):
    pid: int
    rss_kib: int  # the kept agent's resident memory now
    cpu_s: float  # its user+system CPU seconds so far
    answered: int  # the calls it answered
