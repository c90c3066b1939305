"""app's stand-in for the `wandb` package, imported as `wandb` when W&B is not installed.

It keeps what a training script relies on: `init` returning a Run, `wandb.run`,
`wandb.config` (the run's parameters from APP_PARAMS over init's config), `log` with
W&B's step rules, `summary`, `define_metric`, `finish`. Logged numbers go to the capture
file (metrics_file.py). Nothing goes to the network and no other file is written. Anything
else of W&B's public surface is a no-op, noted once on stderr (see noop.py); a private name
(`run._label(...)`, which transformers' WandbCallback calls) is a no-op without a note.
"""
import atexit
import operator
import os
import sys
import types
from collections.abc import Mapping

from _app_capture import metrics_file, noop, params
from _app_capture.builtin_config import (  # noqa: F401 (wandb's public names)
    CommError,
    Config,
    ConfigError,
    Error,
    PreInit,
    Summary,
    UsageError,
    config_dict,
)
from _app_capture.steps import StepRules

__version__ = "0.0.0+app"
__app_builtin__ = True

run = None
config = PreInit("wandb.config")
summary = PreInit("wandb.summary")

# Names that `wandb.<submodule>` stubs give besides this module's own (noop.py):
# `except ConfigError:` needs the class that Config raises (transformers' WandbCallback
# imports it from wandb.sdk.lib.config_util).
_SUBMODULE_NAMES = {"ConfigError": ConfigError}

# Private names that stay missing, because code tests for them: Lightning's WandbLogger
# calls `wandb._attach(...)` in a spawned process when `hasattr(wandb, "_attach")`, and
# would get a no-op for a run; without it, it calls `wandb.init` there.
_ABSENT_PRIVATE_NAMES = frozenset(("_attach",))

# Run methods that are no-ops here without a note: the common calls of training scripts.
_QUIET_RUN_METHODS = frozenset((
    "watch", "unwatch", "save", "alert", "log_artifact", "use_artifact", "log_code",
    "mark_preempting", "finish_artifact", "link_artifact", "log_model", "use_model",
    "link_model", "restore", "status", "upsert_artifact",
))


def _warn(text):
    sys.stderr.write(f"wandb: WARNING {text}\n")


def _new_id():
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
    return "".join(alphabet[byte % 36] for byte in os.urandom(8))


class Run:
    _attach_id = None  # W&B's: no other process can attach to this run

    def __init__(self, entity, project, name, id, group, job_type, notes, tags, mode, settings_dir):
        self.id = id or os.environ.get("WANDB_RUN_ID") or _new_id()
        self.name = name or os.environ.get("WANDB_NAME") or f"run-{self.id}"
        self.project = project or os.environ.get("WANDB_PROJECT") or "uncategorized"
        self.entity = entity or os.environ.get("WANDB_ENTITY")
        self.group = group or os.environ.get("WANDB_RUN_GROUP")
        self.job_type = job_type or os.environ.get("WANDB_JOB_TYPE")
        self.notes = notes
        self.tags = tuple(tags or ())
        self.sweep_id = os.environ.get("WANDB_SWEEP_ID")
        # Files a script puts in run.dir are kept by app when it is the job's output dir.
        self.dir = os.environ.get("APP_OUTPUT_DIR") or settings_dir or os.getcwd()
        self.mode = mode
        self.url = None
        self.resumed = False
        self.offline = False
        self.disabled = mode == "disabled"
        self._rules = StepRules(metrics_file.shared(), warn=_warn)
        self.config = Config()
        self.summary = Summary(self._rules)
        self._finished = False
        atexit.register(self._at_exit)

    @property
    def path(self):
        return "/".join(part for part in (self.entity, self.project, self.id) if part)

    @property
    def step(self):
        return self._rules.step

    @property
    def _step(self):  # older scripts read W&B's private counter
        return self._rules.step

    def log(self, data, step=None, commit=None, sync=None):
        if self._finished:
            raise UsageError(
                f"Run ({self.id}) is finished. The call to `log` will be ignored."
                " Please make sure that you are using an active run."
            )
        if not isinstance(data, Mapping):
            raise TypeError("wandb.log must be passed a dictionary")
        for key in data:
            if not isinstance(key, str):
                raise TypeError("Key values passed to `wandb.log` must be strings.")
        if step is not None:
            step = operator.index(step)  # W&B refuses a float step the same way
        self.summary._logged(data)
        if not metrics_file.is_off():
            try:
                self._rules.log(data, step, commit)
            except Exception as error:
                metrics_file.turn_off(f"internal error in wandb.log: {error!r}")

    def define_metric(self, name, step_metric=None, step_sync=None, hidden=None, summary=None,
                      goal=None, overwrite=None, **kwargs):
        # The checks of W&B's Run._define_metric, so a script fails here as it would there.
        if not name:
            raise Error("define_metric() requires non-empty name argument")
        if step_metric is not None and not isinstance(step_metric, str):
            step_metric = getattr(step_metric, "name", step_metric)
        if not isinstance(name, str) or (step_metric is not None and not isinstance(step_metric, str)):
            raise Error("Unhandled define_metric() arg: name or step_metric is not a str")
        if "*" in (name[:-1] if name.endswith("*") else name):
            raise Error(f"Unhandled define_metric() arg: name (glob suffixes only): {name}")
        for operation in summary.split(",") if summary else ():
            if operation.lower() not in ("min", "max", "mean", "last", "copy", "none", "first"):
                raise Error(f"Unhandled define_metric() arg: summary op: {operation}")
        try:
            self._rules.define_metric(name, step_metric, step_sync, overwrite)
        except Exception as error:
            metrics_file.turn_off(f"internal error in define_metric: {error!r}")
        return noop.Noop(f"Metric({name!r})")

    def finish(self, exit_code=None, quiet=None):
        global run, config, summary
        if self._finished:
            return
        self._finished = True
        try:
            self._rules.finish()
        except Exception as error:
            metrics_file.turn_off(f"internal error in finish: {error!r}")
        if run is self:
            run = None
            config = PreInit("wandb.config")
            summary = PreInit("wandb.summary")

    def _at_exit(self):
        if not self._finished and not metrics_file.is_off():
            try:
                self._rules.finish()
            except Exception as error:
                metrics_file.turn_off(f"internal error at exit: {error!r}")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self.finish(exit_code=0 if exc_type is None else 1)
        return False

    def __getattr__(self, name):
        # Dunders stay missing (copy, pickle and inspect probe them). A private name is
        # W&B's internals, which integrations call (`run._label(code=...)`): a quiet no-op.
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if not name.startswith("_") and name not in _QUIET_RUN_METHODS:
            noop.note_once(f"wandb.Run.{name}")
        return noop.Noop(f"run.{name}")

    def __repr__(self):
        return f"<wandb.Run {self.path} (app built-in)>"


def init(entity=None, project=None, dir=None, id=None, name=None, notes=None, tags=None,
         config=None, config_exclude_keys=None, config_include_keys=None, allow_val_change=None,
         group=None, job_type=None, mode=None, force=None, reinit=None, resume=None,
         resume_from=None, fork_from=None, save_code=None, tensorboard=None,
         sync_tensorboard=None, monitor_gym=None, settings=None, **kwargs):
    """W&B's `wandb.init`, same parameters in the same order; most only name the run."""
    global run
    init_config = config_dict(config or {}, config_include_keys, config_exclude_keys)
    if run is not None:
        # W&B: reinit True / "finish_previous" finishes the active run, "create_new" runs
        # beside it, and anything else returns it ("returning the previous run").
        if reinit in (True, "finish_previous"):
            run.finish()
        elif reinit != "create_new":
            return run
    new_run = Run(entity, project, name, id, group, job_type, notes, tags,
                  mode or os.environ.get("WANDB_MODE"), dir)
    new_run.config.update(init_config, allow_val_change=True)
    new_run.config.merge_locked(params.load())
    if not metrics_file.is_off():
        metrics_file.shared().open()
    _set_global_run(new_run)
    return new_run


def _set_global_run(new_run):
    global run, config, summary
    run, config, summary = new_run, new_run.config, new_run.summary


def _active_run(call):
    if run is None:
        raise Error(f"You must call wandb.init() before {call}()")
    return run


def log(data, step=None, commit=None, sync=None):
    _active_run("wandb.log").log(data, step=step, commit=commit)


def define_metric(name, step_metric=None, step_sync=None, hidden=None, summary=None, goal=None,
                  overwrite=None, **kwargs):
    return _active_run("wandb.define_metric").define_metric(
        name, step_metric, step_sync, hidden, summary, goal, overwrite
    )


def finish(exit_code=None, quiet=None):
    if run is not None:
        run.finish(exit_code=exit_code)


def login(*args, **kwargs):
    return True


def sweep(*args, **kwargs):
    """The sweep is app's; a script that starts its own gets an id that does nothing."""
    return os.environ.get("WANDB_SWEEP_ID") or "app-sweep"


def agent(sweep_id, function=None, entity=None, project=None, count=None):
    """app has already chosen this run's parameters: run the function once with them."""
    if function is not None:
        function()


def termlog(string="", newline=True, repeat=True, prefix=True):
    sys.stderr.write(("wandb: " if prefix else "") + str(string) + ("\n" if newline else ""))


def termwarn(string, newline=True, repeat=True, prefix=True):
    termlog(f"WARNING {string}", newline, repeat, prefix)


def termerror(string, newline=True, repeat=True, prefix=True):
    termlog(f"ERROR {string}", newline, repeat, prefix)


def _quiet_noop(name):
    return noop.Noop(f"wandb.{name}")


for _name in ("watch", "unwatch", "save", "alert", "log_artifact", "use_artifact", "log_model",
              "use_model", "link_model", "mark_preempting", "termsetup", "setup", "teardown",
              "require", "restore", "plot", "log_code"):
    globals()[_name] = _quiet_noop(_name)

for _name in ("Image", "Table", "Histogram", "Video", "Audio", "Html", "Object3D", "Molecule",
              "Plotly", "Graph", "Artifact", "Settings", "AlertLevel", "Api", "Classes",
              "Box3D"):
    globals()[_name] = noop.noop_class(_name)
del _name

# `except wandb.errors.CommError:` needs real exception classes.
errors = types.SimpleNamespace(Error=Error, UsageError=UsageError, CommError=CommError)


def __getattr__(name):
    """Any other name: a no-op, noted once when public (module __getattr__, PEP 562)."""
    if (name.startswith("__") and name.endswith("__")) or name in _ABSENT_PRIVATE_NAMES:
        raise AttributeError(f"module 'wandb' has no attribute {name!r}")
    if not name.startswith("_"):
        noop.note_once(f"wandb.{name}")
    stand_in = noop.stand_in(name, f"wandb.{name}")
    globals()[name] = stand_in
    return stand_in
