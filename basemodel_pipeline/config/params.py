"""Config models of data_params and training_params."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Literal

from pydantic import Field, PositiveInt, ValidationError, field_validator, model_validator

from basemodel_pipeline.config.base import Strict
from basemodel_pipeline.dates import END_DAY, FIRST_DAY
from basemodel_pipeline.errors import ConfigError

# A date relative to the (resolved) training_end_date: "-8w", "-56d" or "-8splits" (split intervals).
RELATIVE = r"^-\d+(d|w|splits)$"
Relative = Annotated[str, Field(pattern=RELATIVE)]


class DataParams(Strict):
    """Where the windows lie. Fixed dates, or rolling ones resolved against the data at each run:
    ``training_end_date: auto`` is the cache's last event day minus the longest scenario horizon (the last day
    counts as partial: every test window ends before it), ``training_end_date: -47d`` that day minus 47 days
    (room for several weekly test windows), and ``validation_start_date`` / ``training_start_date`` may count
    back from the resolved training_end_date ("-8w", "-56d", "-8splits")."""

    data_start_date: dt.date = Field(description="Events before this date are ignored.")
    training_start_date: dt.date | Relative | None = Field(
        default=None,
        description="First split point for training examples (default: data_start_date + 28 days), or an "
        "offset back from training_end_date.",
    )
    validation_start_date: dt.date | Relative = Field(
        description="Split points from this date on are validation only (a date, or an offset back from "
        "training_end_date such as -8w)."
    )
    training_end_date: dt.date | Literal["auto"] | Relative = Field(
        description="No training or validation target window extends past this date; the test split point. "
        "auto: the last event day in the cache minus the longest scenario horizon, at each run; an offset "
        "such as -47d or -7w: the last event day minus that (at least the longest horizon), at each run."
    )
    split_interval_days: int = Field(default=7, gt=0, description="Days between scenario split points.")
    test_split_points: int = Field(
        default=4,
        gt=0,
        description="Test split points per scenario: training_end_date and the split points after it (every "
        "split_interval_days) whose target windows end by the last event day (counted as partial, as for "
        "auto), at most this many. Several test weeks give the test metrics more examples and tighter "
        "intervals (an entity's windows are resampled together); 1 tests on training_end_date alone.",
    )
    data_end_date: dt.date | None = Field(
        default=None,
        description="The last day of a historical data set that receives no new days (a demo, a one-off "
        "study): the daily extract partitions end there instead of today, and events after it are left out "
        "(counted). Leave it out for live data.",
    )
    future_events: Literal["drop", "error", "keep"] = Field(
        default="drop",
        description="Events stamped after tomorrow (UTC) at extract time: drop them with a count in the log "
        "and the metadata (default), fail the extract, or keep them (data that is legitimately dated ahead).",
    )

    @field_validator(
        "data_start_date",
        "training_start_date",
        "validation_start_date",
        "training_end_date",
        "data_end_date",
    )
    @classmethod
    def _in_range(cls, value: object) -> object:
        """Dates beyond what timestamps hold (9999-12-31 overflowed date arithmetic in a traceback)."""
        if isinstance(value, dt.date) and not FIRST_DAY <= value < END_DAY:
            raise ValueError(
                f"{value} lies outside the dates the pipeline handles, {FIRST_DAY} up to (not including) "
                f"{END_DAY}, where nanosecond timestamps end: use a date in that range"
            )
        return value

    @property
    def rolling(self) -> bool:
        """Whether some date is relative to the data and must be resolved (`resolved`) before training."""
        return not all(
            isinstance(d, dt.date | None)
            for d in (self.training_start_date, self.validation_start_date, self.training_end_date)
        )

    def _date(self, name: str) -> dt.date:
        value = getattr(self, name)
        if not isinstance(value, dt.date):
            raise ConfigError(
                f"data_params.{name} is {value!r}: rolling windows are resolved against the cache at each run "
                "(pipeline stages do it); resolve them first with DataParams.resolved(last_event_day, horizon)"
            )
        return value

    @property
    def first_split(self) -> dt.date:
        if self.training_start_date is None:
            return self.data_start_date + dt.timedelta(days=28)
        return self._date("training_start_date")

    @property
    def validation_start(self) -> dt.date:
        return self._date("validation_start_date")

    @property
    def test_date(self) -> dt.date:
        return self._date("training_end_date")

    def offset_days(self, value: str) -> int:
        """Days of a relative date such as "-8w" (56), "-10d" (10) or "-4splits" (4 split intervals)."""
        match = re.fullmatch(RELATIVE, value)
        assert match is not None  # the field's pattern
        unit = match.group(1)
        return int(value[1 : -len(unit)]) * {"d": 1, "w": 7, "splits": self.split_interval_days}[unit]

    def resolved(self, last_event_day: dt.date, longest_horizon_days: int) -> DataParams:
        """These params with concrete dates: auto = last_event_day - the longest horizon (test windows end
        before the possibly partial last day); relative starts count back from that end."""
        end = self.training_end_date
        if end == "auto":
            end = last_event_day - dt.timedelta(days=longest_horizon_days)
        elif isinstance(end, str):
            back = self.offset_days(end)
            if back < longest_horizon_days:
                raise ConfigError(
                    f"data_params.training_end_date: {end} puts the test split point {back} days before the "
                    f"last event day, but the longest scenario horizon is {longest_horizon_days} days: its test "
                    f"window would run past the data; use -{longest_horizon_days}d or more (or auto)"
                )
            end = last_event_day - dt.timedelta(days=back)
        assert isinstance(end, dt.date)
        update: dict[str, dt.date] = {"training_end_date": end}
        for name in ("validation_start_date", "training_start_date"):
            value = getattr(self, name)
            if isinstance(value, str):
                update[name] = end - dt.timedelta(days=self.offset_days(value))
        try:
            return DataParams.model_validate({**self.model_dump(), **update})
        except ValidationError as err:
            reason = "; ".join(e["msg"].removeprefix("Value error, ") for e in err.errors())
            raise ConfigError(
                f"data_params: the rolling windows resolved against the data (last event day {last_event_day}) "
                f"are not usable: {reason}; shorten the offsets or wait for more data"
            ) from None

    @model_validator(mode="after")
    def _ordered(self) -> DataParams:
        if self.data_end_date is not None and self.data_end_date <= self.data_start_date:
            raise ValueError(
                f"data_end_date ({self.data_end_date}) must be after data_start_date ({self.data_start_date})"
            )
        if self.rolling:
            return self
        order = [
            ("data_start_date", self.data_start_date),
            ("training_start_date", self.first_split),
            ("validation_start_date", self.validation_start),
            ("training_end_date", self.test_date),
        ]
        for (a, da), (b, db) in zip(order, order[1:], strict=False):
            if not da < db:
                raise ValueError(f"{a} ({da}) must be before {b} ({db})")
        return self


class FoundationParams(Strict):
    horizon_days: int = Field(default=28, gt=0, description="Future window the foundation model predicts.")
    half_lives_days: list[float] = Field(default=[7.0, 30.0, 120.0], min_length=1)
    sketch_partitions: int = Field(
        default=4, gt=0, description="Hash partitions per high-cardinality column."
    )
    sketch_width: int = Field(
        default=32, gt=1, description="Buckets per partition (a power of two for dlsh)."
    )
    sketch_method: Literal["dlsh", "random"] = Field(
        default="dlsh",
        description="dlsh: buckets from Cleora embeddings of the values (similar values share buckets); "
        "random: a seeded hash of each value.",
    )
    fourier_scales: list[Annotated[float, Field(gt=0)]] = Field(
        default=[0.5, 2.0],
        description="Numeric columns also add sin/cos(scale * signed log1p(value)) channels per scale: a "
        "multi-scale encoding of the value distribution ([] to turn off).",
    )
    calendar_features: bool = Field(
        default=True, description="Weekday and time-of-day (4-hour) channels of every event."
    )
    embedding_dim: int = Field(default=32, gt=0, description="Cleora embedding size (dlsh).")
    embedding_iterations: int = Field(default=4, gt=0, description="Cleora propagation steps (dlsh).")
    embedding_max_events: int = Field(
        default=2_000_000, gt=0, description="Events sampled (whole entities) to build the Cleora graph."
    )
    max_direct_vocab: int = Field(
        default=64, gt=0, description="Columns with at most this many values are counted per value."
    )
    aggregate_features: bool = Field(
        default=True,
        description="Append automatic windowed aggregates (counts, sums, recency...) to the sketches.",
    )
    hidden_dim: int = Field(default=256, gt=0)
    num_blocks: int = Field(default=2, gt=0)
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    input_dropout: float = Field(
        default=0.5,
        ge=0.0,
        lt=1.0,
        description="Share of the standardised inputs set to their mean in each pretraining example. With few "
        "entities the trunk otherwise learns what followed its training weeks, and heads or probes fitted on "
        "those weeks then trust what is gone at inference time (docs/benchmarks.md, 'Probe').",
    )
    epochs: int = Field(default=4, gt=0)
    patience: int = Field(
        default=2, gt=0, description="Stop when the validation loss has not improved for this many epochs."
    )
    activity_loss_weight: float = Field(
        default=1.0,
        ge=0,
        description="Weight of the activity targets (any event within 7/14/horizon days) against the sketch "
        "cross-entropies: higher keeps more 'whether and when' information in the trunk.",
    )
    next_event_days: list[PositiveInt] = Field(
        default=[],
        description="More points of the time-to-next-event curve the foundation predicts per source (any event "
        "within d days, besides 7 and 14 and the horizon; censored at the horizon): a discrete-time survival "
        "target for churn-like scenarios. Points not shorter than horizon_days are ignored.",
    )
    split_points_per_entity: int = Field(
        default=8, gt=0, description="Random split points per entity per epoch (at most)."
    )
    max_examples_per_epoch: int = Field(
        default=262144,
        gt=0,
        description="Cap on training examples per epoch. Above it, each epoch samples entities (one split point "
        "each when there are more entities than the cap): training time then stops growing with the data.",
    )
    batch_size: Annotated[int, Field(gt=0)] | Literal["auto"] = Field(
        default="auto",
        description="Examples per step; auto: 256 for small epochs, up to 1024 (CPU) or 4096 (GPU) for large ones.",
    )
    loader_workers: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        default="auto",
        description="Background threads featurising the next chunk while the model trains; auto: 1 with >= 4 "
        "CPU cores or a GPU, else 0 (inline).",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="Matmul precision of training; auto: bf16 autocast on GPUs and on CPUs with native bf16 "
        "(AVX512-BF16/AMX), else fp32. Weights and optimizer state stay fp32.",
    )
    learning_rate: float = Field(default=1e-3, gt=0)
    weight_decay: float = Field(default=1e-4, ge=0)
    warmup_steps: int = Field(default=50, ge=0)
    validation_entities: int = Field(
        default=20000, gt=0, description="Entities sampled for the foundation's validation loss."
    )
    checkpoint_every_steps: int = Field(
        default=200,
        ge=0,
        description="Save a resumable training state every N steps (0: off).",
    )
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @model_validator(mode="after")
    def _dlsh_width(self) -> FoundationParams:
        w = self.sketch_width
        if self.sketch_method == "dlsh" and w & (w - 1):
            raise ValueError(f"sketch_width must be a power of two with sketch_method dlsh (got {w}); try 32")
        return self


class FinetuneParams(Strict):
    refit_on_validation: bool = Field(
        default=False,
        description="After the choice, train the published candidate again on the training and validation "
        "windows together (the epochs / rounds early stopping chose), so the model learns from the newest "
        "labelled windows. Its test metric then compares a model that saw more windows with baselines that did "
        "not; the report says so.",
    )
    refit_on_all: bool = Field(
        default=True,
        description="The production refit: after the choice and the test measurement, train the published "
        "candidate (a blend keeps its weights) again on every window whose label is complete by the data's last "
        "event day (training, validation, test and any later complete window), so what `predict` serves has "
        "learned the newest labelled weeks, as a data scientist's own refitted LightGBM would. The reported "
        "test metrics are those of the model before this refit; metrics.json's `fit_windows` says which "
        "windows each fit learned from. A scenario's own `refit_on_all` overrides it.",
    )
    max_train_examples: int = Field(
        default=500_000,
        gt=0,
        description="At most this many (entity, split point) training examples, drawn at random (seeded) when "
        "a scenario has more: the features of every example are held in memory (examples x input features x 4 "
        "bytes), so without a cap fine-tuning grows with entities x weeks. The metrics record how many there were.",
    )
    max_validation_examples: int = Field(
        default=200_000,
        gt=0,
        description="The same cap for the validation windows (early stopping, the choice).",
    )
    max_test_examples: int = Field(
        default=200_000,
        gt=0,
        description="The same cap for the test window: the test metric is measured on a random sample of this "
        "size (predict always scores every entity).",
    )
    epochs: int = Field(default=12, gt=0)
    batch_size: Annotated[int, Field(gt=0)] | Literal["auto"] = Field(
        default="auto",
        description="Examples per step of a scenario network; auto: 256, and for a head on a frozen trunk "
        "(mode frozen) doubled up to 2048 while an epoch keeps at least 128 steps (as the foundation's auto "
        "batch): a head's step costs about the same at any of these sizes, so on many examples larger batches cut "
        "the time, and small data keeps small ones.",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="Matmul precision of the frozen trunk's pass over a scenario's examples (mode frozen: the "
        "outputs its head learns from); auto: bf16 where the hardware runs it natively (GPUs, CPUs with "
        "AVX512-BF16/AMX), as `predict`'s auto precision serves the model, else fp32.",
    )
    learning_rate: float = Field(default=1e-3, gt=0)
    weight_decay: float = Field(default=1e-4, ge=0)
    patience: int = Field(
        default=3, gt=0, description="Epochs without validation improvement before stopping."
    )
    mode: Literal["full", "frozen", "lora"] = Field(
        default="frozen",
        description="frozen: train only the head on the foundation trunk (best on small data); full: fine-tune "
        "all; lora: low-rank adapters on the trunk's linear layers + head.",
    )
    checkpoint_every_epochs: int = Field(
        default=1,
        ge=0,
        description="Save a resumable state of the scenario network's training every N epochs (0: off): a "
        "killed fine-tuning restarts at the next epoch.",
    )
    seed: int = 0


class TrainingParams(Strict):
    foundation: FoundationParams = Field(default_factory=FoundationParams)
    finetune: FinetuneParams = Field(default_factory=FinetuneParams)


class CacheParams(Strict):
    """How the event cache is built (DuckDB sorts the extracts by entity and time)."""

    duckdb_memory_limit: str = Field(
        default="2GB",
        pattern=r"^\d+(\.\d+)?\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)$",
        description="DuckDB memory limit while building; beyond it DuckDB spills to spill_directory.",
    )
    spill_directory: str | None = Field(
        default=None, description="Where DuckDB spills (default: inside the cache's staging directory)."
    )
    threads: int | None = Field(default=None, gt=0, description="DuckDB threads (default: all cores).")
    shards: int | None = Field(
        default=None,
        gt=0,
        description="Entity-hash shards, each a contiguous range of entity indices sorted and written on its own "
        "(default: one per shard_events events).",
    )
    shard_events: int = Field(
        default=8_000_000,
        gt=0,
        description="Target events per shard when `shards` is not set; bounds the memory of the per-shard sort.",
    )
    max_appends: int = Field(
        default=64,
        ge=0,
        description="Appended day segments kept before the next append first compacts them into the base "
        "(entity indices and codes kept; 0: never append, rebuild instead).",
    )
