"""W&B's history step rules for one run, turning `log` calls into metric lines.

One implementation serves the built-in `wandb` and the mirror of the real one. The rules
follow wandb-core's handler (`handlePartialHistorySync`, `flushPartialHistory`) and the
`Run.log` docstring:

- "By default, each call to `log` creates a new step": a row is built up in `pending`
  and committed at the current step, which then advances by one.
- "commit: If true, finalize and upload the step. If false, then accumulate data for the
  step. If `step` is `None`, then the default is `commit=True`; otherwise, the default is
  `commit=False`."
- "The step must always increase, and it is not possible to log to a previous step": a
  step below the current one drops the whole call (commit included) with a warning; a
  step above it first commits the pending row at the current step.
- `define_metric(name, step_metric=X)`: wandb-core inserts "the last value of step_metric"
  into a row that lacks X when step_sync is on (the default once step_metric is given),
  starting from 0 when X was never logged. Here that value becomes the line's `step`.
  A glob name may only end in `*` and matches every key with that prefix, `/` included
  (wandb 0.16, 0.19 and 0.31 alike: `val/*` gives `val/deep/x` the step metric, and
  transformers' `define_metric("*", step_metric="train/global_step")` reaches
  `train/loss`); keys starting with `_` never match a glob.
"""
import math
import threading

# W&B's own history keys; a user value under these names is not a metric of the run.
_WANDB_KEYS = frozenset(("_step", "_runtime", "_timestamp"))


def metric_value(value):
    """The number W&B would chart for `value`, or None (media, text, NaN, infinities)."""
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is int:
        return value
    if kind is bool or value is None:
        return None
    if isinstance(value, (int, float)):  # numpy.float64 is a float subclass, IntEnum an int
        return metric_value(float(value) if isinstance(value, float) else int(value))
    # numpy scalars and one-element arrays, torch/jax/tf tensors: without importing them.
    item = getattr(value, "item", None)
    if item is None or not callable(item):
        return None
    try:
        size = getattr(value, "size", 1)
        if callable(size):  # torch.Tensor.size() is the shape; numel() is the count
            size = value.numel()
        if size != 1:
            return None
        number = item()
    except Exception:
        return None
    if type(number) in (int, float):
        return metric_value(number)
    return None


def flatten(data, prefix, into):
    """`{"train": {"loss": 1}}` as W&B shows it: `train.loss`."""
    for key, value in data.items():
        name = prefix + str(key)
        if isinstance(value, dict):
            flatten(value, name + ".", into)
        else:
            number = metric_value(value)
            if number is not None:
                into[name] = number
    return into


class MetricDefinition:
    __slots__ = ("step_metric", "step_sync")

    def __init__(self, step_metric, step_sync):
        self.step_metric = step_metric
        self.step_sync = step_sync


class StepRules:
    """The step counter, the pending row and the metric definitions of one run."""

    def __init__(self, sink, warn=None, starting_step=0):
        self.sink = sink
        self.warn = warn  # None where the real wandb prints its own warnings
        self.step = starting_step
        self.pending = {}
        self.definitions = {}  # exact name -> MetricDefinition (globs expand into it)
        self.globs = []  # (prefix, MetricDefinition), in definition order
        self.latest = {}  # step metric name -> last value seen
        self.lock = threading.Lock()

    def log(self, data, step=None, commit=None):
        with self.lock:
            if step is not None:
                if step < self.step:
                    if self.warn:
                        self.warn(
                            f"Tried to log to step {step} that is less than the current step"
                            f" {self.step}. Steps must be monotonically increasing, so this"
                            " data will be ignored. See https://wandb.me/define-metric to log"
                            " data out of order."
                        )
                    return
                if step > self.step:
                    self._commit()
                    self.step = step
            flatten(data, "", self.pending)
            if commit is None:
                commit = step is None
            if commit:
                self._commit()
                self.step += 1

    def finish(self):
        """Commits the pending row (run.finish, or interpreter exit)."""
        with self.lock:
            self._commit()

    def summary(self, data):
        """A summary value is written as a point at the current step."""
        with self.lock:
            points = flatten(data, "", {})
            for name in _WANDB_KEYS.intersection(points):
                del points[name]
            points.pop("step", None)
            if points:
                self.sink.write_points({self.step: points})

    def define_metric(self, name, step_metric=None, step_sync=None, overwrite=None):
        if step_sync is None:
            step_sync = step_metric is not None
        with self.lock:
            if step_metric and step_metric not in self.latest:
                self.latest[step_metric] = 0
            if name.endswith("*"):
                prefix = name[:-1]
                previous = None if overwrite else next((d for p, d in self.globs if p == prefix), None)
                definition = _merged(previous, step_metric, step_sync)
                self.globs = [(p, d) for p, d in self.globs if p != prefix] + [(prefix, definition)]
            else:
                previous = None if overwrite else self.definitions.get(name)
                self.definitions[name] = _merged(previous, step_metric, step_sync)

    def _definition(self, name):
        definition = self.definitions.get(name)
        if definition is None and self.globs and not name.startswith("_"):
            for prefix, glob_definition in self.globs:
                if name.startswith(prefix):
                    # wandb-core turns a glob match into a definition of its own.
                    self.definitions[name] = definition = glob_definition
                    break
        return definition

    def _commit(self):
        row = self.pending
        if not row:
            return
        self.pending = {}
        for step_metric in self.latest:
            if step_metric in row:
                self.latest[step_metric] = row[step_metric]
        by_step = {}
        for name, value in row.items():
            if name in _WANDB_KEYS or name == "step":
                # `step` names the line's step in APP_METRICS_FILE, so a metric of that
                # name cannot be written; it can still serve as a step_metric.
                continue
            step = self.step
            if self.definitions or self.globs:
                definition = self._definition(name)
                if definition is not None and definition.step_metric:
                    if definition.step_metric in row:
                        step = int(row[definition.step_metric])
                    elif definition.step_sync:
                        step = int(self.latest[definition.step_metric])
            points = by_step.get(step)
            if points is None:
                by_step[step] = points = {}
            points[name] = value
        self.sink.write_points(by_step)


def _merged(previous, step_metric, step_sync):
    """wandb-core's definedMetric.With: unset fields keep the earlier call's values."""
    if previous is None:
        return MetricDefinition(step_metric, step_sync)
    return MetricDefinition(step_metric or previous.step_metric, previous.step_sync or step_sync)
