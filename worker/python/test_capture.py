"""Tests of the W&B capture layer, run as real Python subprocesses: `python3 test_capture.py`.

Each test lays the files out as the worker does (sitecustomize.py and _app_capture/ at the
top of a directory first on PYTHONPATH), with a temporary HOME, and runs a small script.
The real-wandb tests need APP_TEST_REAL_WANDB_PYTHON, a python with wandb installed; W&B
runs offline there, with no account, network or prompt.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REAL_WANDB_PYTHON = os.environ.get("APP_TEST_REAL_WANDB_PYTHON")
# A python with transformers and torch (and wandb or not): a real Trainer.train() on CPU.
TRANSFORMERS_PYTHON = os.environ.get("APP_TEST_TRANSFORMERS_PYTHON")
TIMEOUT_S = 120


def builtin_python(test_class):
    """A python without wandb: this one, or a bare venv of its base interpreter."""
    probe = subprocess.run([sys.executable, "-c", "import wandb"], capture_output=True)
    if probe.returncode != 0:
        return sys.executable
    venv = tempfile.mkdtemp(prefix="app-capture-venv-")
    test_class.addClassCleanup(shutil.rmtree, venv, True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    return os.path.join(venv, "bin", "python")


# What transformers' Trainer does with W&B (transformers 5.24,
# src/transformers/integrations/integration_utils.py: is_wandb_available, rewrite_logs and
# WandbCallback, its wandb calls unchanged; modelcard, TPU and the fake Trainer of
# on_train_end left out), driven as a short training with WANDB_LOG_MODEL=checkpoint.
TRANSFORMERS_TRAINER = """
import importlib.util, numbers, os, tempfile
from pathlib import Path


def is_wandb_available():
    if importlib.util.find_spec("wandb") is not None:
        import wandb
        return hasattr(wandb, "run")
    return False


def rewrite_logs(d):
    new_d = {}
    for k, v in d.items():
        if k.startswith("eval_"):
            new_d["eval/" + k[len("eval_"):]] = v
        elif k.startswith("test_"):
            new_d["test/" + k[len("test_"):]] = v
        else:
            new_d["train/" + k] = v
    return new_d


def save_model_architecture_to_file(model, output_dir):
    with open(f"{output_dir}/model_architecture.txt", "w+") as f:
        print(model, file=f)


class WandbCallback:
    def __init__(self):
        if not is_wandb_available():
            raise RuntimeError("WandbCallback requires wandb to be installed. Run `pip install wandb`.")
        import wandb
        self._wandb = wandb
        self._initialized = False
        self._log_model = os.getenv("WANDB_LOG_MODEL", "false")  # WandbLogModel
        self._log_model_enabled = self._log_model in ("end", "checkpoint")

    def setup(self, args, state, model, **kwargs):
        if self._wandb is None:
            return
        self._initialized = True
        from wandb.sdk.lib.config_util import ConfigError as WandbConfigError
        if state.is_world_process_zero:
            combined_dict = {**args.to_dict()}
            if hasattr(model, "config") and model.config is not None:
                model_config = model.config if isinstance(model.config, dict) else model.config.to_dict()
                combined_dict = {**model_config, **combined_dict}
            trial_name = state.trial_name
            init_args = {}
            if trial_name is not None:
                init_args["name"] = trial_name
                init_args["group"] = args.run_name or args.output_dir
            elif args.run_name is not None:
                init_args["name"] = args.run_name
                if args.run_name == args.output_dir:
                    self._wandb.termwarn("The `run_name` is currently set to the same value as"
                                         " `TrainingArguments.output_dir`.", repeat=False)
            if self._wandb.run is None:
                self._wandb.init(project=os.getenv("WANDB_PROJECT", "huggingface"), **init_args)
            self._wandb.config.update(combined_dict or {}, allow_val_change=True)
            if getattr(self._wandb, "define_metric", None):
                self._wandb.define_metric("train/global_step")
                self._wandb.define_metric("*", step_metric="train/global_step", step_sync=True)
            _watch_model = os.getenv("WANDB_WATCH", "false")
            if _watch_model in ("all", "parameters", "gradients"):
                self._wandb.watch(model, log=_watch_model, log_freq=max(100, state.logging_steps))
            self._wandb.run._label(code="transformers_trainer")
            try:
                self._wandb.config["model/num_parameters"] = model.num_parameters()
            except AttributeError:
                pass
            except WandbConfigError:
                pass
            if self._log_model_enabled:
                with tempfile.TemporaryDirectory() as temp_dir:
                    model_name = (f"model-{self._wandb.run.id}"
                                  if (args.run_name is None or args.run_name == args.output_dir)
                                  else f"model-{self._wandb.run.name}")
                    model_artifact = self._wandb.Artifact(name=model_name, type="model", metadata={
                        "model_config": model.config.to_dict() if hasattr(model, "config") else None,
                        "num_parameters": self._wandb.config.get("model/num_parameters"),
                        "initial_model": True,
                    })
                    save_model_architecture_to_file(model, temp_dir)
                    for f in Path(temp_dir).glob("*"):
                        if f.is_file():
                            with model_artifact.new_file(f.name, mode="wb") as fa:
                                fa.write(f.read_bytes())
                    self._wandb.run.log_artifact(model_artifact, aliases=["base_model"])
                    badge_markdown = f"[badge]({self._wandb.run.url})"

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._wandb is None:
            return
        if state.is_hyper_param_search:
            self._wandb.finish()
            self._initialized = False
            args.run_name = None
        if not self._initialized:
            self.setup(args, state, model, **kwargs)

    def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self._wandb is None:
            return
        if self._log_model_enabled and self._initialized and state.is_world_process_zero:
            with tempfile.TemporaryDirectory() as temp_dir:
                Path(temp_dir, "model.safetensors").write_bytes(b"weights")  # fake_trainer.save_model
                metadata = {k: v for k, v in dict(self._wandb.summary).items()
                            if isinstance(v, numbers.Number) and not k.startswith("_")}
                metadata["final_model"] = True
                model_name = (f"model-{self._wandb.run.id}"
                              if (args.run_name is None or args.run_name == args.output_dir)
                              else f"model-{self._wandb.run.name}")
                save_model_architecture_to_file(model, temp_dir)
                artifact = self._wandb.Artifact(name=model_name, type="model", metadata=metadata)
                for f in Path(temp_dir).glob("*"):
                    if f.is_file():
                        with artifact.new_file(f.name, mode="wb") as fa:
                            fa.write(f.read_bytes())
                self._wandb.run.log_artifact(artifact, aliases=["final_model"])

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        single_value_scalars = ["train_runtime", "train_samples_per_second", "train_steps_per_second",
                                "train_loss", "total_flos"]
        if self._wandb is None:
            return
        if not self._initialized:
            self.setup(args, state, model)
        if state.is_world_process_zero:
            for k, v in logs.items():
                if k in single_value_scalars:
                    self._wandb.run.summary[k] = v
            non_scalar_logs = {k: v for k, v in logs.items() if k not in single_value_scalars}
            non_scalar_logs = rewrite_logs(non_scalar_logs)
            self._wandb.log({**non_scalar_logs, "train/global_step": state.global_step})

    def on_save(self, args, state, control, **kwargs):
        if self._log_model == "checkpoint" and self._initialized and state.is_world_process_zero:
            checkpoint_metadata = {k: v for k, v in dict(self._wandb.summary).items()
                                   if isinstance(v, numbers.Number) and not k.startswith("_")}
            checkpoint_metadata["model/num_parameters"] = self._wandb.config.get("model/num_parameters")
            ckpt_dir = f"checkpoint-{state.global_step}"
            artifact_path = os.path.join(args.output_dir, ckpt_dir)
            checkpoint_name = (f"model-{self._wandb.run.id}"
                               if (args.run_name is None or args.run_name == args.output_dir)
                               else f"model-{self._wandb.run.name}")
            artifact = self._wandb.Artifact(name=checkpoint_name, type="model", metadata=checkpoint_metadata)
            artifact.add_dir(artifact_path)
            self._wandb.log_artifact(
                artifact, aliases=[f"epoch_{round(state.epoch, 2)}", f"checkpoint_global_step_{state.global_step}"]
            )


class Args:
    run_name = "tiny-run"
    output_dir = os.path.abspath("out")
    def to_dict(self):
        return {"output_dir": self.output_dir, "learning_rate": 0.5, "num_train_epochs": 1,
                "run_name": self.run_name, "logging_steps": 10}


class State:
    is_world_process_zero = True
    is_hyper_param_search = False
    trial_name = None
    logging_steps = 10
    global_step = 0
    epoch = 0.0


class ModelConfig:
    def to_dict(self):
        return {"hidden_size": 8, "model_type": "tiny"}


class Model:
    config = ModelConfig()
    def num_parameters(self):
        return 1234
    def __repr__(self):
        return "Tiny(hidden_size=8)"


os.environ["WANDB_LOG_MODEL"] = "checkpoint"
args, state, model = Args(), State(), Model()
callback = WandbCallback()
callback.on_train_begin(args, state, None, model=model)
for state.global_step, loss in ((10, 1.5), (20, 1.0)):
    state.epoch = state.global_step / 20
    callback.on_log(args, state, None, model=model, logs={
        "loss": loss, "grad_norm": 0.25, "learning_rate": 0.5 - state.epoch / 4, "epoch": state.epoch})
os.makedirs(os.path.join(args.output_dir, "checkpoint-20"))
Path(args.output_dir, "checkpoint-20", "model.safetensors").write_bytes(b"weights")
callback.on_save(args, state, None)
callback.on_log(args, state, None, model=model, logs={"eval_loss": 0.75, "eval_runtime": 0.5, "epoch": 1.0})
callback.on_log(args, state, None, model=model, logs={
    "train_runtime": 2.5, "train_samples_per_second": 8.0, "train_steps_per_second": 8.0,
    "total_flos": 0.0, "train_loss": 1.25, "epoch": 1.0})
callback.on_train_end(args, state, None, model=model)
import wandb
print(wandb.config["learning_rate"], wandb.config["model/num_parameters"], wandb.config["hidden_size"])
"""

# The rows of that training: define_metric("*", step_metric="train/global_step") puts each
# metric at the global step logged with it; train/global_step itself, defined without a
# step metric, and the summary values sit at W&B's own step (one per log call).
TRANSFORMERS_LINES = [
    {"step": 10, "train/loss": 1.5, "train/grad_norm": 0.25, "train/learning_rate": 0.375, "train/epoch": 0.5},
    {"step": 0, "train/global_step": 10},
    {"step": 20, "train/loss": 1.0, "train/grad_norm": 0.25, "train/learning_rate": 0.25, "train/epoch": 1.0},
    {"step": 1, "train/global_step": 20},
    {"step": 20, "eval/loss": 0.75, "eval/runtime": 0.5, "train/epoch": 1.0},
    {"step": 2, "train/global_step": 20},
    {"step": 3, "train_runtime": 2.5}, {"step": 3, "train_samples_per_second": 8.0},
    {"step": 3, "train_steps_per_second": 8.0}, {"step": 3, "total_flos": 0.0}, {"step": 3, "train_loss": 1.25},
    {"step": 20, "train/epoch": 1.0},
    {"step": 3, "train/global_step": 20},
]


class Job:
    """One job's directories: the worker's layer, the working directory, HOME, metrics.

    The worker sets APP_CAPTURE_FILE (the file the hook writes) and APP_METRICS_FILE (the
    script's own); `capture_env = False` plays an older worker that sets only the latter.
    """

    def __init__(self, test):
        self.root = tempfile.mkdtemp(prefix="app-capture-")
        test.addCleanup(shutil.rmtree, self.root, True)
        self.layer = os.path.join(self.root, "layer")
        os.makedirs(self.layer)
        shutil.copy(os.path.join(HERE, "sitecustomize.py"), self.layer)
        shutil.copytree(os.path.join(HERE, "_app_capture"), os.path.join(self.layer, "_app_capture"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        self.work = os.path.join(self.root, "work")
        self.home = os.path.join(self.root, "home")
        os.makedirs(self.work)
        os.makedirs(self.home)
        self.metrics = os.path.join(self.root, "metrics.jsonl")
        self.capture = os.path.join(self.root, "capture.jsonl")
        self.capture_env = True
        self.params = {}  # None: APP_PARAMS left out
        self.extra_path = []  # PYTHONPATH entries after the layer
        self.env = {}

    def environment(self, with_layer=True):
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("WANDB_", "APP_")) and key not in ("PYTHONPATH", "NETRC")}
        env["HOME"] = self.home
        if with_layer:
            env["PYTHONPATH"] = os.pathsep.join([self.layer] + self.extra_path)
            env["APP_METRICS_FILE"] = self.metrics
            if self.capture_env:
                env["APP_CAPTURE_FILE"] = self.capture
            if self.params is not None:
                env["APP_PARAMS"] = json.dumps(self.params)
        elif self.extra_path:
            env["PYTHONPATH"] = os.pathsep.join(self.extra_path)
        env.update(self.env)
        return env

    def run(self, python, source, with_layer=True):
        script = os.path.join(self.work, "train.py")
        with open(script, "w") as file:
            file.write(textwrap.dedent(source))
        return subprocess.run([python, script], cwd=self.work, env=self.environment(with_layer),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT_S)

    def lines(self):
        """The rows the hook wrote, from the file it writes."""
        path = self.capture if self.capture_env else self.metrics
        if not os.path.exists(path):
            return []
        with open(path) as file:
            return [json.loads(line) for line in file]

    def check_metrics_file_untouched(self, test):
        """With APP_CAPTURE_FILE set the hook never writes the script's APP_METRICS_FILE."""
        if self.capture_env:
            test.assertFalse(os.path.exists(self.metrics), "the hook wrote APP_METRICS_FILE")


class BuiltinWandb(unittest.TestCase):
    """`import wandb` where W&B is not installed gives app's built-in module."""

    @classmethod
    def setUpClass(cls):
        cls.python = builtin_python(cls)

    def setUp(self):
        self.job = Job(self)

    def run_ok(self, source):
        result = self.job.run(self.python, source)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.job.check_metrics_file_untouched(self)
        return result

    def test_each_log_commits_a_row_at_the_next_step(self):
        self.run_ok("""
            import wandb
            wandb.init(project="p")
            wandb.log({"loss": 1.0, "acc": 0.5})
            wandb.log({"loss": 0.5})
            print(wandb.__version__, wandb.run.step)
        """)
        self.assertEqual(self.job.lines(), [{"step": 0, "loss": 1.0, "acc": 0.5}, {"step": 1, "loss": 0.5}])

    def test_commit_false_accumulates_into_the_pending_row(self):
        self.run_ok("""
            import wandb
            run = wandb.init()
            run.log({"a": 1}, commit=False)
            run.log({"b": 2}, commit=False)
            run.log({"a": 3})
            run.log({"c": 4})
        """)
        self.assertEqual(self.job.lines(), [{"step": 0, "a": 3, "b": 2}, {"step": 1, "c": 4}])

    def test_explicit_steps(self):
        result = self.run_ok("""
            import wandb
            wandb.init()
            wandb.log({"a": 1})                      # step 0, then 1
            wandb.log({"b": 2}, step=5)              # pending at 5: with a step, commit defaults to False
            wandb.log({"c": 3}, step=5)
            wandb.log({"old": 9}, step=2)            # below the current step: dropped
            wandb.log({"d": 4}, step=7)              # commits the row of step 5 first
            wandb.log({"e": 5}, step=7, commit=True)
            wandb.log({"f": 6})
        """)
        self.assertEqual(self.job.lines(), [
            {"step": 0, "a": 1}, {"step": 5, "b": 2, "c": 3}, {"step": 7, "d": 4, "e": 5}, {"step": 8, "f": 6},
        ])
        self.assertIn("Tried to log to step 2 that is less than the current step 5", result.stderr)

    def test_define_metric_takes_its_step_from_the_step_metric(self):
        self.run_ok("""
            import wandb
            wandb.init()
            wandb.define_metric("val/*", step_metric="epoch")
            wandb.define_metric("acc", step_metric="it", step_sync=False)
            wandb.log({"val/loss": 0.9})                     # epoch never logged: 0, as W&B
            wandb.log({"val/loss": 0.5, "epoch": 3, "train": 1.0})
            wandb.log({"val/loss": 0.4, "val/deep/x": 7})    # last epoch; a glob '*' crosses '/'
            wandb.log({"acc": 0.7})                          # no step_sync: the internal step
        """)
        self.assertEqual(self.job.lines(), [
            {"step": 0, "val/loss": 0.9},
            {"step": 3, "val/loss": 0.5}, {"step": 1, "epoch": 3, "train": 1.0},
            {"step": 3, "val/loss": 0.4, "val/deep/x": 7},
            {"step": 3, "acc": 0.7},
        ])

    def test_values_flatten_and_only_finite_numbers_count(self):
        self.run_ok("""
            import math, wandb
            class NumpyScalar:      # numpy-like: size 1, item() gives a Python number
                size = 1
                def item(self): return 0.25
            class TorchTensor:      # torch-like: size() is the shape, numel() the count
                def size(self): return (1,)
                def numel(self): return 1
                def item(self): return 2
            class Vector:
                size = 3
                def item(self): raise ValueError("only one element tensors")
            wandb.init()
            wandb.log({"train": {"loss": 1.5, "inner": {"x": 2}}, "text": "hi", "nan": math.nan,
                       "inf": math.inf, "flag": True, "none": None, "np": NumpyScalar(),
                       "torch": TorchTensor(), "vec": Vector(), "image": wandb.Image(None)})
        """)
        self.assertEqual(self.job.lines(), [{"step": 0, "train.loss": 1.5, "train.inner.x": 2, "np": 0.25, "torch": 2}])

    def test_summary_values_are_points_at_the_current_step(self):
        self.run_ok("""
            import wandb
            run = wandb.init()
            run.log({"loss": 1.0})
            run.summary["best"] = 0.5
            wandb.summary.update({"final": {"acc": 0.9}})
            print(run.summary["loss"], run.summary.best)
        """)
        self.assertEqual(self.job.lines(), [
            {"step": 0, "loss": 1.0}, {"step": 1, "best": 0.5}, {"step": 1, "final.acc": 0.9},
        ])

    def test_finish_commits_the_pending_row(self):
        result = self.run_ok("""
            import wandb
            with wandb.init() as run:
                run.log({"a": 1}, step=4)
            print(wandb.run)
            wandb.init()
            wandb.log({"b": 2}, commit=False)
            wandb.finish()
        """)
        self.assertEqual(self.job.lines(), [{"step": 4, "a": 1}, {"step": 0, "b": 2}])
        self.assertEqual(result.stdout.splitlines()[0], "None")

    def test_exit_commits_the_pending_row_when_finish_is_never_called(self):
        self.run_ok("""
            import wandb
            wandb.init()
            wandb.log({"a": 1})
            wandb.log({"b": 2}, step=9)
        """)
        self.assertEqual(self.job.lines(), [{"step": 0, "a": 1}, {"step": 9, "b": 2}])

    def test_params_win_over_init_config_as_in_a_sweep(self):
        self.job.params = {"lr": 0.01, "optimizer": {"lr": 0.5}, "layers": 4}
        result = self.run_ok("""
            import wandb
            wandb.init(config={"lr": 0.1, "optimizer": {"lr": 1.0, "name": "sgd"}, "epochs": 3})
            c = wandb.config
            print(c.lr, c["layers"], c.optimizer["lr"], c.optimizer["name"], c.epochs, c.get("nope", "-"))
            c.update({"lr": 0.2, "batch": 8})   # lr is locked by the sweep: ignored with a warning
            c.setdefaults({"batch": 99, "seed": 1})
            print(c.lr, c.batch, c.seed, sorted(c.keys()) == sorted(c.as_dict()))
            print(hasattr(c, "missing"))
        """)
        self.assertEqual(result.stdout.split("\n")[:3], ["0.01 4 0.5 sgd 3 -", "0.01 8 1 True", "False"])
        self.assertIn("Config item 'lr' was locked by 'sweep' (ignored update).", result.stderr)

    def test_config_before_init_and_log_after_finish_fail_as_in_wandb(self):
        self.run_ok("""
            import wandb
            for call in (lambda: wandb.config.lr, lambda: wandb.log({"a": 1})):
                try:
                    call()
                except wandb.Error as error:
                    print(error)
            run = wandb.init()
            run.finish()
            try:
                run.log({"a": 1})
            except wandb.errors.UsageError as error:
                print("usage error")
        """)
        self.assertEqual(self.job.lines(), [])

    def test_a_crash_inside_init_raises_what_wandb_raises(self):
        result = self.job.run(self.python, """
            import wandb
            wandb.init(config=object())
        """)
        self.assertEqual(result.returncode, 1)
        self.assertIn("TypeError: config must be a dict or have a __dict__ attribute.", result.stderr)

    def test_an_exception_in_a_with_block_propagates_and_flushes(self):
        result = self.job.run(self.python, """
            import wandb
            with wandb.init() as run:
                run.log({"a": 1}, step=2)
                raise KeyError("boom")
        """)
        self.assertEqual(result.returncode, 1)
        self.assertIn("KeyError: 'boom'", result.stderr)
        self.assertEqual(self.job.lines(), [{"step": 2, "a": 1}])

    def test_what_is_not_modelled_does_nothing(self):
        result = self.run_ok("""
            import wandb
            from wandb.integration.keras import WandbMetricsLogger
            from wandb.errors import CommError
            run = wandb.init(settings=wandb.Settings(start_method="thread"))
            wandb.Foo(1, x=2).bar().baz
            class Callback(wandb.SomeCallback):
                pass
            Callback(3)
            WandbMetricsLogger()
            table = wandb.Table(columns=["a"])
            table.add_data(1)
            wandb.log({"chart": wandb.plot.line(table, "a", "a"), "x": 1})
            wandb.watch(object())
            run.log_artifact(wandb.Artifact("model", type="model"))
            run.something_new(1)
            wandb.alert(title="t", text="x")
            print(issubclass(CommError, wandb.Error), run.id == wandb.run.id, run.project)
        """)
        self.assertEqual(result.stdout.strip(), "True True uncategorized")
        self.assertIn("[app] wandb.Foo is not modelled", result.stderr)
        self.assertIn("[app] wandb.Run.something_new is not modelled", result.stderr)
        self.assertEqual(result.stderr.count("wandb.Foo"), 1)
        self.assertEqual(self.job.lines(), [{"step": 0, "x": 1}])

    def test_private_names_are_quiet_noops_and_dunders_stay_missing(self):
        result = self.run_ok("""
            import copy, pickle, wandb
            from wandb.sdk.lib.config_util import ConfigError
            run = wandb.init()
            run._label(code="transformers_trainer")
            run._set_config_wandb("x", 1)._more
            wandb._sentry.exception(ValueError())
            run.log({"a": 1})
            noop = pickle.loads(pickle.dumps(run._some_state))
            print(run._step, noop, copy.copy(noop))
            print(hasattr(run, "__missing__"), hasattr(wandb, "__missing__"), hasattr(wandb, "_attach"),
                  run._attach_id)
            try:
                wandb.config["x"] = 1
                wandb.config["x"] = 2
            except ConfigError as error:   # the class Config raises
                print("ConfigError")
        """)
        self.assertEqual(result.stdout.splitlines(), [
            "1 <app no-op run._some_state> <app no-op run._some_state>",
            "False False False None",
            "ConfigError",
        ])
        self.assertNotIn("[app]", result.stderr)
        self.assertEqual(self.job.lines(), [{"step": 0, "a": 1}])

    def test_transformers_wandb_callback(self):
        self.job.params = {"learning_rate": 0.125}
        result = self.run_ok(TRANSFORMERS_TRAINER)
        self.assertEqual(result.stdout.splitlines(), ["0.125 1234 8"])
        self.assertEqual(self.job.lines(), TRANSFORMERS_LINES)
        self.assertEqual(result.stderr.strip(), "[app] Config item 'learning_rate' was locked by 'sweep' (ignored update).")

    def test_params_come_from_app_params_file_when_app_params_is_left_out(self):
        self.job.params = None
        params_file = os.path.join(self.job.root, "params.json")
        with open(params_file, "w") as file:
            json.dump({"lr": 0.01, "big": "x" * 40000}, file)
        self.job.env["APP_PARAMS_FILE"] = params_file
        result = self.run_ok("""
            import wandb
            wandb.init(config={"lr": 0.1, "epochs": 2})
            print(wandb.config.lr, wandb.config.epochs, len(wandb.config.big))
        """)
        self.assertEqual(result.stdout.strip(), "0.01 2 40000")
        self.assertNotIn("[app]", result.stderr)

    def test_without_app_params_the_config_is_inits_and_a_note_says_so(self):
        self.job.params = None
        result = self.run_ok("""
            import wandb
            wandb.init(config={"lr": 0.1})
            wandb.finish()
            wandb.init(config={"lr": 0.2})
            wandb.log({"a": 1})
            print(dict(wandb.config))
        """)
        self.assertEqual(result.stdout.strip(), "{'lr': 0.2}")
        self.assertEqual(result.stderr.count("[app] the run's parameters are not in wandb.config"), 1, result.stderr)
        self.assertEqual(self.job.lines(), [{"step": 0, "a": 1}])

    def test_an_unreadable_app_params_file_is_a_note(self):
        self.job.params = None
        self.job.env["APP_PARAMS_FILE"] = os.path.join(self.job.root, "missing.json")
        result = self.run_ok("""
            import wandb
            wandb.init(config={"lr": 0.1})
            print(wandb.config.lr)
        """)
        self.assertEqual(result.stdout.strip(), "0.1")
        self.assertIn("[app] the run's parameters are not in wandb.config: cannot read APP_PARAMS_FILE", result.stderr)

    def test_a_wandb_folder_in_the_working_directory_does_not_hide_the_builtin(self):
        os.makedirs(os.path.join(self.job.work, "wandb", "offline-run-1"))
        self.run_ok("""
            import wandb
            wandb.init()
            wandb.log({"a": 1})
        """)
        self.assertEqual(self.job.lines(), [{"step": 0, "a": 1}])

    def test_lines_go_to_app_capture_file_and_the_scripts_metrics_file_is_its_own(self):
        # The script truncates its APP_METRICS_FILE ("w") between logs: our lines are elsewhere.
        result = self.job.run(self.python, """
            import json, os, wandb
            wandb.init()
            for own in (1, 2):
                with open(os.environ["APP_METRICS_FILE"], "w") as file:
                    file.write(json.dumps({"own": own}) + "\\n")
                wandb.log({"loss": 1.0 / own})
        """)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(self.job.metrics) as file:
            self.assertEqual(file.read(), '{"own": 2}\n')
        self.assertEqual(self.job.lines(), [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.5}])

    def test_an_older_worker_without_app_capture_file_gets_the_lines_in_app_metrics_file(self):
        # Lines stay whole even when the script appends its own to the same file.
        self.job.capture_env = False
        self.run_ok("""
            import os, threading, wandb
            wandb.init()
            def own_lines():
                with open(os.environ["APP_METRICS_FILE"], "a") as file:
                    for i in range(2000):
                        file.write('{"own": %d}\\n' % i)
                        file.flush()
            thread = threading.Thread(target=own_lines)
            thread.start()
            for i in range(2000):
                wandb.log({"loss": i / 7, "deep": {"x": "y" * 50, "y": i}})
            thread.join()
        """)
        lines = self.job.lines()  # each line parses
        self.assertEqual(len(lines), 4000)
        self.assertEqual(sum(1 for line in lines if "loss" in line), 2000)

    def test_capture_failing_leaves_the_script_running(self):
        self.job.capture = os.path.join(self.job.root, "missing", "capture.jsonl")
        result = self.run_ok("""
            import wandb
            wandb.init()
            wandb.log({"a": 1})
            print(wandb.config.as_dict(), "done")
        """)
        self.assertEqual(result.stdout.strip(), "{} done")
        self.assertEqual(result.stderr.count("[app] metric capture is off:"), 1, result.stderr)
        self.assertIn("cannot open APP_CAPTURE_FILE", result.stderr)

    def test_without_app_capture_file_and_app_metrics_file_nothing_is_installed(self):
        self.job.env["APP_METRICS_FILE"] = ""
        self.job.env["APP_CAPTURE_FILE"] = ""
        result = self.job.run(self.python, "import wandb\n")
        self.assertIn("ModuleNotFoundError: No module named 'wandb'", result.stderr)

    def test_app_capture_file_alone_installs_capture(self):
        self.job.env["APP_METRICS_FILE"] = ""
        self.run_ok("""
            import wandb
            wandb.init()
            wandb.log({"a": 1})
        """)
        self.assertEqual(self.job.lines(), [{"step": 0, "a": 1}])


class Sitecustomize(unittest.TestCase):
    """Ours shadows any other sitecustomize; that one must still run, errors and all."""

    def setUp(self):
        self.job = Job(self)
        self.user_site = os.path.join(self.job.root, "user-site")
        os.makedirs(self.user_site)
        self.job.extra_path = [self.user_site]

    def write_user_sitecustomize(self, source):
        with open(os.path.join(self.user_site, "sitecustomize.py"), "w") as file:
            file.write(textwrap.dedent(source))

    def test_the_shadowed_sitecustomize_still_runs(self):
        self.write_user_sitecustomize("""
            import builtins, os
            builtins.USER_SITE = os.path.basename(os.path.dirname(__file__))
        """)
        result = self.job.run(sys.executable, "print(USER_SITE)\n")
        self.assertEqual(result.stdout.strip(), "user-site", result.stderr)

    def test_its_errors_show_as_python_shows_them_without_us(self):
        self.write_user_sitecustomize("1 / 0\n")
        script = "print('script ran')\n"
        with_us = self.job.run(sys.executable, script)
        without_us = self.job.run(sys.executable, script, with_layer=False)
        self.assertEqual(with_us.stdout, "script ran\n")
        self.assertEqual(with_us.stderr, without_us.stderr)
        self.assertIn("Error in sitecustomize", with_us.stderr)


@unittest.skipUnless(REAL_WANDB_PYTHON, "set APP_TEST_REAL_WANDB_PYTHON to a python with wandb installed")
class RealWandb(unittest.TestCase):
    """The installed wandb, patched: offline without credentials, mirrored into the file."""

    def setUp(self):
        self.job = Job(self)

    def run_ok(self, source):
        result = self.job.run(REAL_WANDB_PYTHON, source)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.job.check_metrics_file_untouched(self)
        return result

    def test_runs_offline_and_mirrors_log_and_config(self):
        self.job.params = {"lr": 0.01, "nested": {"depth": 3}}
        result = self.run_ok("""
            import os, wandb
            run = wandb.init(project="p", config={"lr": 0.1, "epochs": 2})
            wandb.log({"loss": 1.0})
            wandb.log({"loss": 0.5})
            # Offline through init's mode: the environment is the script's.
            print(run.offline, os.environ.get("WANDB_MODE"), wandb.config.lr, wandb.config.epochs,
                  wandb.config.nested["depth"])
        """)
        self.assertEqual(result.stdout.splitlines()[0], "True None 0.01 2 3")  # wandb's own lines follow
        self.assertEqual(self.job.lines(), [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.5}])
        self.assertEqual(result.stderr.count("so wandb runs offline"), 1, result.stderr)

    def test_the_users_wandb_mode_is_kept(self):
        self.job.env["WANDB_MODE"] = "disabled"
        result = self.run_ok("""
            import os, wandb
            run = wandb.init(project="p")
            wandb.log({"loss": 1.0})
            run.finish()
            # wandb before 0.19 gives a disabled run that is no Run and is not mirrored.
            print(os.environ["WANDB_MODE"], isinstance(run, wandb.sdk.wandb_run.Run))
        """)
        mode, is_run = result.stdout.splitlines()[0].split()
        self.assertEqual(mode, "disabled")
        if is_run == "True":
            self.assertEqual(self.job.lines(), [{"step": 0, "loss": 1.0}])

    # `offline(...)`: whether our wandb.init would add mode="offline" to these arguments.
    DECISION = """
        import inspect, os, wandb
        from _app_capture import real_wandb
        def offline(*args, **kwargs):
            call = real_wandb.offline_init_arguments(inspect.signature(wandb.init), args, kwargs)
            return call is not None and inspect.signature(wandb.init).bind(*call[0], **call[1]).arguments["mode"]
    """

    def test_credentials_or_a_mode_of_the_users_leave_the_mode_alone(self):
        result = self.run_ok(self.DECISION + """
        print(offline(), offline(project="p"))
        mode_position = list(inspect.signature(wandb.init).parameters).index("mode")
        print(offline(mode="online"), offline(*[None] * mode_position, "online"))  # positional
        print(offline(settings=wandb.Settings(mode="offline")), offline(settings={"mode": "online"}))
        print(offline(settings=wandb.Settings(api_key="k" * 40)), offline(settings={"api_key": "k" * 40}))
        os.environ["WANDB_API_KEY"] = "k" * 40           # set by the script after import
        print(offline())
        del os.environ["WANDB_API_KEY"]
        print(offline())
        for host in ("api.wandb.ai", "api.forge.coreweave.com"):   # wandb 0.31 writes the latter
            with open(os.path.expanduser("~/.netrc"), "w") as file:
                file.write(f"machine {host}\\n  login user\\n  password " + "k" * 40 + "\\n")
            os.chmod(os.path.expanduser("~/.netrc"), 0o600)
            print(host, offline())
        os.environ["WANDB_BASE_URL"] = "https://wandb.example.com"   # a key for another host
        print(offline())
        """)
        self.assertEqual(result.stdout.splitlines(), [
            "offline offline", "False False", "False False", "False False", "False", "offline",
            "api.wandb.ai False", "api.forge.coreweave.com False", "offline",
        ])
        self.assertNotIn("[app]", result.stderr)

    def test_settings_given_to_wandb_setup_count(self):
        result = self.run_ok(self.DECISION + """
        print(offline())
        wandb.setup(settings=wandb.Settings(api_key="k" * 40))
        print(offline())
        """)
        self.assertEqual(result.stdout.splitlines()[:2], ["offline", "False"], result.stderr)

    def test_login_with_a_key_is_not_made_offline(self):
        # wandb 0.31 refused wandb.login(key=...) when we had set WANDB_MODE=offline at
        # import ("Unable to verify login in offline mode", False). Now it verifies the key
        # with the server, which fails here (no network, a made-up key): what matters is
        # that it tried. verify=False then logs in without the server.
        result = self.run_ok(self.DECISION + """
        print(offline())
        try:
            outcome = wandb.login(key="k" * 40)
        except Exception as error:
            outcome = type(error).__name__
        print(outcome, os.environ.get("WANDB_MODE"))
        print(wandb.login(key="k" * 40, verify=False), os.environ.get("WANDB_MODE"), offline())
        if os.path.exists(os.path.expanduser("~/.netrc")):   # where wandb saved the key
            os.remove(os.path.expanduser("~/.netrc"))
        print(offline())                                     # the login itself counts
        """)
        lines = result.stdout.splitlines()
        self.assertEqual(lines[0], "offline", result.stderr)
        self.assertIn(lines[1], ("True None", "AuthenticationError None"), result.stderr)
        self.assertEqual(lines[2:4], ["True None False", "False"], result.stderr)
        self.assertNotIn("Unable to verify login in offline mode", result.stderr)
        self.assertNotIn("[app]", result.stderr)

    def test_login_without_credentials_returns_false_and_the_run_is_offline(self):
        # Without a terminal wandb.login() raises UsageError for want of a key; here it
        # runs offline as wandb.login() does in offline mode.
        result = self.run_ok("""
            import wandb
            print(wandb.login())
            run = wandb.init(project="p")
            wandb.log({"a": 1})
            print(run.offline)
        """)
        self.assertEqual(result.stdout.splitlines()[:2], ["False", "True"])
        self.assertEqual(result.stderr.count("so wandb runs offline"), 1, result.stderr)
        self.assertEqual(self.job.lines(), [{"step": 0, "a": 1}])

    def test_login_without_a_key_keeps_wandbs_error_where_the_user_chose_online(self):
        self.job.env["WANDB_MODE"] = "online"
        result = self.job.run(REAL_WANDB_PYTHON, "import wandb\nwandb.login()\n")
        self.assertEqual(result.returncode, 1)
        self.assertIn("UsageError", result.stderr)

    def test_transformers_wandb_callback(self):
        self.job.params = {"learning_rate": 0.125}
        result = self.run_ok(TRANSFORMERS_TRAINER)
        self.assertEqual(result.stdout.splitlines()[0], "0.125 1234 8")
        self.assertEqual(self.job.lines(), TRANSFORMERS_LINES)
        self.assertNotIn("metric capture is off", result.stderr)

    def test_params_come_from_app_params_file_when_app_params_is_left_out(self):
        self.job.params = None
        params_file = os.path.join(self.job.root, "params.json")
        with open(params_file, "w") as file:
            json.dump({"lr": 0.01, "big": "x" * 40000}, file)
        self.job.env["APP_PARAMS_FILE"] = params_file
        result = self.run_ok("""
            import wandb
            wandb.init(project="p", config={"lr": 0.1, "epochs": 2})
            print(wandb.config.lr, wandb.config.epochs, len(wandb.config.big))
        """)
        self.assertEqual(result.stdout.splitlines()[0], "0.01 2 40000")

    def test_without_app_params_the_config_is_inits_and_a_note_says_so(self):
        self.job.params = None
        result = self.run_ok("""
            import wandb
            wandb.init(project="p", config={"lr": 0.1})
            print(wandb.config.lr)
        """)
        self.assertEqual(result.stdout.splitlines()[0], "0.1")
        self.assertEqual(result.stderr.count("[app] the run's parameters are not in wandb.config"), 1, result.stderr)

    def test_a_crash_inside_init_raises_what_it_raises_without_us(self):
        source = "import wandb\nwandb.init(config=object())\n"
        self.job.env["WANDB_MODE"] = "offline"
        with_us = self.job.run(REAL_WANDB_PYTHON, source)
        without_us = self.job.run(REAL_WANDB_PYTHON, source, with_layer=False)
        last_line = lambda result: result.stderr.strip().splitlines()[-1]
        self.assertEqual(with_us.returncode, without_us.returncode)
        self.assertEqual(last_line(with_us), last_line(without_us))

    def test_the_mirror_agrees_with_wandbs_own_history(self):
        self.run_ok("""
            import wandb
            run = wandb.init(project="p")
            run.log({"a": 1})
            run.log({"b": 2}, commit=False)
            run.log({"c": 3}, step=4)
            run.log({"d": 4}, step=2)
            run.define_metric("val/*", step_metric="epoch")
            run.log({"val/loss": 0.5, "epoch": 2, "n": {"x": 1.5}, "s": "text"})
            run.log({"val/deep/x": 0.25})            # the glob's '*' crosses '/'
            run.summary["best"] = 0.25
            run.log({"e": 5}, step=9)
        """)
        self.assertEqual(self.job.lines(), [
            {"step": 0, "a": 1}, {"step": 1, "b": 2},
            {"step": 4, "c": 3, "epoch": 2, "n.x": 1.5}, {"step": 2, "val/loss": 0.5},
            {"step": 2, "val/deep/x": 0.25}, {"step": 6, "best": 0.25}, {"step": 9, "e": 5},
        ])
        history = wandb_history(self.job.work)
        if history is not None:  # wandb's own record of the same run
            self.assertEqual([row["_step"] for row in history], [0, 1, 4, 5, 9])
            self.assertEqual(history[2]["epoch"], 2)
            self.assertEqual(history[3]["epoch"], 2)  # step_sync: the last epoch inserted

    def test_transformers_rows_agree_with_wandbs_own_history(self):
        self.run_ok(TRANSFORMERS_TRAINER)
        history = wandb_history(self.job.work)
        if history is not None:
            # Each row of W&B's own carries train/global_step, the step of the mirrored points.
            mirrored = {}
            for line in self.job.lines():
                for name, value in line.items():
                    if name != "step" and "/" in name and name != "train/global_step":
                        mirrored.setdefault(line["step"], {})[name] = value
            logged = {}
            for row in history:
                points = {k: v for k, v in row.items() if "/" in k and k != "train/global_step"}
                if points:
                    logged.setdefault(row["train/global_step"], {}).update(points)
            self.assertEqual(mirrored, logged)


@unittest.skipUnless(TRANSFORMERS_PYTHON, "set APP_TEST_TRANSFORMERS_PYTHON to a python with transformers and torch")
class TransformersTrainer(unittest.TestCase):
    """A real `Trainer(report_to=["wandb"]).train()`: a tiny model built here, no download."""

    def test_train_reports_its_metrics_at_the_global_step(self):
        job = Job(self)
        job.params = {"learning_rate": 0.125}
        job.env["HF_HUB_OFFLINE"] = "1"
        result = job.run(TRANSFORMERS_PYTHON, """
            import torch
            from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
            torch.manual_seed(0)
            model = BertForSequenceClassification(BertConfig(
                vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=16, num_labels=2))
            data = [{"input_ids": torch.randint(0, 50, (6,)), "attention_mask": torch.ones(6, dtype=torch.long),
                     "labels": torch.tensor(i % 2)} for i in range(16)]
            args = TrainingArguments(output_dir="out", report_to=["wandb"], logging_steps=2, max_steps=6,
                                     save_strategy="no", eval_strategy="steps", eval_steps=3, use_cpu=True,
                                     per_device_train_batch_size=2)
            Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:4]).train()
            import wandb
            print("config", wandb.config["learning_rate"])
        """)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("config 0.125", result.stdout)
        self.assertNotIn("metric capture is off", result.stderr)
        job.check_metrics_file_untouched(self)
        steps = {}
        for line in job.lines():
            for name in line:
                steps.setdefault(name, []).append(line["step"])
        self.assertEqual(steps["train/loss"], [2, 4, 6])
        self.assertEqual(steps["eval/loss"], [3, 6])
        self.assertIn("train_loss", steps)


def wandb_history(work):
    """The history rows of the offline run in `work`, read from its .wandb file; None when
    this wandb's file format is not the one known here (it is not a public interface)."""
    script = textwrap.dedent("""
        import glob, json, struct, sys
        from wandb.proto import wandb_internal_pb2 as pb
        [path] = glob.glob(sys.argv[1] + "/wandb/offline-run-*/*.wandb")
        data, position, chunk, rows = open(path, "rb").read(), 7, b"", []
        while position + 7 <= len(data):
            if 32768 - position % 32768 < 7:       # leveldb log: 32 KiB blocks, 7-byte headers
                position += 32768 - position % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[position:position + 7])
            chunk += data[position + 7:position + 7 + length]
            position += 7 + length
            if kind in (1, 4):
                record = pb.Record()
                record.ParseFromString(chunk)
                chunk = b""
                if record.WhichOneof("record_type") == "history":
                    rows.append({item.key or ".".join(item.nested_key): json.loads(item.value_json)
                                 for item in record.history.item})
        print(json.dumps(rows))
    """)
    result = subprocess.run([REAL_WANDB_PYTHON, "-c", script, work], capture_output=True, text=True,
                            timeout=TIMEOUT_S)
    return json.loads(result.stdout) if result.returncode == 0 else None


if __name__ == "__main__":
    unittest.main()
