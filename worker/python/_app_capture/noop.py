"""Stand-ins for the parts of W&B the built-in module does not model.

An unchanged script must never die of an AttributeError on something we leave out, so any
such name gives a no-op: a class for a capitalised name (`wandb.Image(...)`,
`class Cb(wandb.SomeCallback)`, `isinstance(x, wandb.Table)` all work), otherwise a
callable whose attributes and results are no-ops again (`wandb.plot.line(...)`).
"""
from _app_capture import metrics_file

_noted = set()


def note_once(name):
    if name not in _noted:
        _noted.add(name)
        metrics_file.note(f"{name} is not modelled by app's built-in wandb; it does nothing here")


class Noop:
    """Callable; every attribute, item and call result is a no-op; false, empty."""

    __slots__ = ("_name",)

    def __init__(self, name="wandb"):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, key):
        if key.startswith("__"):  # copy, pickle and inspect probe dunders
            raise AttributeError(key)
        return Noop(f"{self._name}.{key}")

    def __setattr__(self, key, value):
        pass

    def __call__(self, *args, **kwargs):
        return self

    def __getitem__(self, key):
        return self

    def __setitem__(self, key, value):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __bool__(self):
        return False

    def __repr__(self):
        return f"<app no-op {self._name}>"

    def __reduce__(self):
        # Pickled (a logger's state sent to a spawned process): comes back as a no-op.
        return (Noop, (self._name,))


class _NoopClassType(type):
    def __getattr__(cls, key):
        if key.startswith("__"):
            raise AttributeError(key)
        return Noop(f"{cls.__name__}.{key}")


class NoopObject(metaclass=_NoopClassType):
    """Base of the no-op classes: accepts any arguments, every attribute is a no-op."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, key):
        if key.startswith("__"):
            raise AttributeError(key)
        return Noop(f"{type(self).__name__}.{key}")

    def __repr__(self):
        return f"<app no-op {type(self).__name__}>"


def noop_class(name):
    return _NoopClassType(name, (NoopObject,), {"__module__": "wandb"})


def stand_in(name, qualified_name):
    """A no-op for `qualified_name`: a class when `name` is capitalised."""
    if name[:1].isupper():
        return noop_class(name)
    return Noop(qualified_name)


class _StubSubmoduleLoader:
    """`import wandb.sdk.wandb_run` and the like under the built-in module.

    The stub's names resolve to the built-in module's own where it has them
    (`from wandb.errors import CommError`, `from wandb.sdk.wandb_run import Run`,
    `from wandb.sdk.lib.config_util import ConfigError`), otherwise to a no-op, noted once
    when the name is public.
    """

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        import sys

        fullname = module.__name__
        module.__path__ = []

        def module_getattr(name):
            if name.startswith("__"):
                raise AttributeError(f"module {fullname!r} has no attribute {name!r}")
            builtin = vars(sys.modules["wandb"])
            if not name.startswith("_") and name in builtin:
                return builtin[name]
            known = builtin.get("_SUBMODULE_NAMES") or {}
            if name in known:
                return known[name]
            if not name.startswith("_"):
                note_once(f"{fullname}.{name}")
            value = stand_in(name, f"{fullname}.{name}")
            setattr(module, name, value)
            return value

        module.__getattr__ = module_getattr


def stub_submodule_spec(fullname):
    import importlib.machinery

    return importlib.machinery.ModuleSpec(fullname, _StubSubmoduleLoader(), is_package=True)
