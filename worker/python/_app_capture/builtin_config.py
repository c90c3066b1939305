"""`wandb.config` and `wandb.summary` of the built-in module, shaped like W&B's.

W&B's Config (wandb/sdk/wandb_config.py) reads and writes keys as items or attributes; a
nested parameter is a plain dict, so `wandb.config.optimizer["lr"]` works and
`wandb.config.optimizer.lr` does not, in W&B as here. A missing key is an AttributeError
for attribute access and a KeyError for item access. Keys set by the run's parameters are
locked as a sweep's are.
"""
from _app_capture import metrics_file, params


class Error(Exception):
    """wandb.Error."""


class UsageError(Error):
    """wandb.errors.UsageError."""


class CommError(Error):
    """wandb.errors.CommError."""


class ConfigError(Error):
    """wandb.sdk.lib.config_util.ConfigError."""


def config_dict(source, include=None, exclude=None):
    """W&B's wandb_helper.parse_config: a dict, an argparse Namespace or any object's vars."""
    if include and exclude:
        raise UsageError("Expected at most only one of exclude or include")
    if isinstance(source, Config):
        source = dict(source.items())
    elif not isinstance(source, dict):
        flag_values = getattr(source, "flag_values_dict", None)  # absl flags
        if callable(flag_values):
            source = flag_values()
        elif hasattr(source, "__dict__"):
            source = vars(source)
        else:
            raise TypeError("config must be a dict or have a __dict__ attribute.")
    if include:
        source = {key: value for key, value in source.items() if key in include}
    if exclude:
        source = {key: value for key, value in source.items() if key not in exclude}
    return source


class Config:
    def __init__(self):
        object.__setattr__(self, "_items", {})
        object.__setattr__(self, "_locked", set())

    def _check_locked(self, key):
        if key in self._locked:
            metrics_file.note(f"Config item '{key}' was locked by 'sweep' (ignored update).")
            return True
        return False

    def _set(self, key, value, allow_val_change):
        key = str(key).strip("-")  # W&B strips dashes from keys
        if self._check_locked(key):
            return
        if not allow_val_change and key in self._items and self._items[key] != value:
            raise ConfigError(
                f'Attempted to change value of key "{key}" from {self._items[key]} to {value}\n'
                "If you really want to do this, pass allow_val_change=True to config.update()"
            )
        self._items[key] = value

    def __setitem__(self, key, value):
        # W&B refuses a changed value here too, unless through update(allow_val_change=True).
        self._set(key, value, allow_val_change=None)

    __setattr__ = __setitem__

    def __getitem__(self, key):
        return self._items[key]

    def __getattr__(self, key):
        try:
            return self._items[key]
        except KeyError:
            raise AttributeError(f"{self.__class__!r} object has no attribute {key!r}") from None

    def __contains__(self, key):
        return key in self._items

    def __iter__(self):
        return iter(self._items)

    def __repr__(self):
        return str(dict(self))

    def keys(self):
        return [key for key in self._items if not key.startswith("_")]

    def items(self):
        return [(key, value) for key, value in self._items.items() if not key.startswith("_")]

    def get(self, *args):
        return self._items.get(*args)

    def as_dict(self):
        return dict(self)

    def update(self, source, allow_val_change=None):
        for key, value in config_dict(source).items():
            self._set(key, value, allow_val_change)

    def setdefaults(self, source):
        for key, value in config_dict(source).items():
            if key not in self._items:
                self._items[key] = value

    def merge_locked(self, source, user="sweep", _allow_val_change=None):
        """Sweep parameters: merged over what is there, then locked."""
        for key, value in source.items():
            previous = self._items.get(key)
            if isinstance(value, dict) and isinstance(previous, dict):
                value = params.merge_dicts(dict(previous), value)
            self._items[key] = value
            self._locked.add(key)

    def persist(self):
        pass


class Summary:
    """`run.summary`: the last value of each logged key, and values set by hand.

    A value set by hand (`summary["best"] = x`, `summary.update(...)`) is also written as a
    metric point at the run's current step, so it reaches app's run.
    """

    def __init__(self, rules):
        object.__setattr__(self, "_items", {})
        object.__setattr__(self, "_rules", rules)

    def _logged(self, data):
        self._items.update(data)

    def update(self, data):
        self._items.update(data)
        if self._rules is not None and not metrics_file.is_off():
            self._rules.summary(data)

    def __setitem__(self, key, value):
        self.update({key: value})

    __setattr__ = __setitem__

    def __getitem__(self, key):
        return self._items[key]

    def __getattr__(self, key):
        try:
            return self._items[key]
        except KeyError:
            raise AttributeError(key) from None

    def __delitem__(self, key):
        del self._items[key]

    __delattr__ = __delitem__

    def __contains__(self, key):
        return key in self._items

    def __iter__(self):
        return iter(self._items)

    def __repr__(self):
        return repr(self._items)

    def keys(self):
        return [key for key in self._items if key != "_wandb"]

    def items(self):
        return [(key, value) for key, value in self._items.items() if key != "_wandb"]

    def get(self, key, default=None):
        return self._items.get(key, default)


class PreInit:
    """`wandb.config` / `wandb.summary` before `wandb.init`: every use raises, as in W&B."""

    def __init__(self, name):
        object.__setattr__(self, "_name", name)

    def _raise(self, key):
        raise Error(f"You must call wandb.init() before {self._name}.{key}")

    def __getattr__(self, key):
        if key.startswith("__"):
            raise AttributeError(key)
        self._raise(key)

    def __getitem__(self, key):
        self._raise(key)

    def __setattr__(self, key, value):
        self._raise(key)

    __setitem__ = __setattr__
