"""Hooks into the installed wandb package: offline without credentials, params, mirroring.

`patch` runs right after wandb's module has run:

- `wandb.init` decides, at each call, whether W&B runs offline: when the user chose no
  mode (no WANDB_MODE or WANDB_DISABLED, no `mode=` or `settings=` mode given to init, no
  `mode` in a settings file) and W&B has no credentials, it gets `mode="offline"`, since
  wandb.init in a job without a terminal would otherwise fail asking for an API key.
  Credentials are looked for where wandb's wbauth looks: WANDB_API_KEY,
  WANDB_IDENTITY_TOKEN_FILE, an `api_key` setting (a settings file, or `settings=` given
  to init or to an earlier `wandb.setup`), a netrc entry for the W&B host ($NETRC, else
  ~/.netrc, else ~/_netrc), and a `wandb.login(key=...)` earlier in the process. The mode
  goes in as init's argument, which wins over the session's settings, and nothing is set
  at `import wandb`: WANDB_MODE=offline set then made wandb 0.31's `wandb.login(key=...)`
  refuse ("Unable to verify login in offline mode"), so the script's own key never took
  effect.
- `wandb.login` notes a key it was given; without one, where init would run offline, the
  UsageError wandb raises for want of an API key (no terminal to ask on) becomes a note
  and `False`, as `wandb.login()` returns in offline mode.
- `wandb.init` gets the run's parameters merged into `run.config` as a sweep's are, and
  the Run methods everything goes through (in wandb 0.31: `wandb.log` is `run.log` after
  init, `with wandb.init()` exits through `Run._finish`) are wrapped to mirror into the
  capture file with the shared step rules. The real method always runs first and the
  mirror never raises.
"""
import atexit
import functools
import operator
import os
import sys
import types
from collections.abc import Mapping

from _app_capture import metrics_file, params
from _app_capture.steps import StepRules

# W&B's hosts: a netrc entry for any host of a family serves the others (wandb 0.31's
# default is the Forge proxy, whose netrc lookup falls back to api.wandb.ai; older
# versions default to api.wandb.ai).
_HOST_FAMILIES = (
    ("api.wandb.ai", "api.forge.coreweave.com", "forge.coreweave.com"),
    ("api.qa.wandb.ai", "api.qa.forge.coreweave.com", "qa.forge.coreweave.com"),
)

_login_key_given = False
_setup_settings = {}  # what the script gave wandb.setup(settings=...) of _SETTINGS_KEYS
_noted_offline = False


def offline_init_arguments(signature, args, kwargs):
    """`(args, kwargs)` for the real wandb.init: with `mode="offline"` when the user chose
    no mode and W&B has no credentials, else None (call it as the script did)."""
    if signature is None or "mode" not in signature.parameters:
        return None
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None  # wandb.init raises its own error
    if bound.arguments.get("mode"):
        return None
    init_settings = dict(_setup_settings)
    init_settings.update((key, value) for key, value in _init_settings(bound.arguments.get("settings")).items()
                         if value is not None)
    environ = os.environ
    file_settings = _settings_files(environ)
    if user_chose_mode(environ, file_settings, init_settings):
        return None
    if has_credentials(environ, file_settings, init_settings):
        return None
    bound.arguments["mode"] = "offline"
    return bound.args, bound.kwargs


def user_chose_mode(environ, file_settings, init_settings):
    if environ.get("WANDB_MODE") or file_settings.get("mode") or init_settings.get("mode"):
        return True
    return any(_true(value) for value in (environ.get("WANDB_DISABLED"), file_settings.get("disabled"),
                                          init_settings.get("disabled")))


def _true(value):
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"))


def has_credentials(environ, file_settings, init_settings=None):
    init_settings = init_settings or {}
    if _login_key_given or environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    for values in (init_settings, file_settings):
        if values.get("api_key") or values.get("identity_token_file"):
            return True
    base_urls = [url for url in (init_settings.get("base_url"), environ.get("WANDB_BASE_URL"),
                                 file_settings.get("base_url")) if url and isinstance(url, str)]
    return _netrc_has_entry(environ, _hosts(base_urls))


def _hosts(base_urls):
    """The netrc machines that hold a key for these base URLs (W&B's defaults if none)."""
    from urllib.parse import urlsplit

    hosts = set()
    for url in base_urls:
        hosts.add(urlsplit(url).netloc or url)
    if not hosts:
        hosts.update(_HOST_FAMILIES[0])
    for family in _HOST_FAMILIES:
        if hosts.intersection(family):
            hosts.update(family)
    return hosts


def _netrc_has_entry(environ, hosts):
    import netrc

    if environ.get("NETRC"):
        path = os.path.expanduser(environ["NETRC"])
    else:
        path = os.path.expanduser("~/.netrc")
        if not os.path.exists(path) and os.path.exists(os.path.expanduser("~/_netrc")):
            path = os.path.expanduser("~/_netrc")
    try:
        entries = netrc.netrc(path)
    except (OSError, netrc.NetrcParseError):
        return False  # wandb warns and treats it as no credentials too
    for host in hosts:
        entry = entries.authenticators(host)
        if entry and entry[2]:
            return True
    return False


def _settings_files(environ):
    """The `[default]` keys of wandb's global then local settings files."""
    import configparser

    config_dir = environ.get("WANDB_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".config", "wandb")
    root = environ.get("WANDB_DIR") or os.getcwd()
    values = {}
    for path in (os.path.join(config_dir, "settings"), os.path.join(root, "wandb", "settings")):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(path)
            if parser.has_section("default"):
                values.update(parser.items("default"))
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
    return values


_SETTINGS_KEYS = ("mode", "disabled", "api_key", "identity_token_file", "base_url")


def _init_settings(settings):
    """What the script set of `_SETTINGS_KEYS` in init's `settings=` (a dict or a Settings)."""
    if settings is None:
        return {}
    if isinstance(settings, Mapping):
        return {key: settings.get(key) for key in _SETTINGS_KEYS}
    explicit = getattr(settings, "model_fields_set", None)  # pydantic Settings, wandb 0.19 on
    values = {}
    for key in _SETTINGS_KEYS:
        if explicit is not None and key not in explicit:
            continue
        try:
            value = getattr(settings, key, None)
        except Exception:
            continue
        # wandb 0.16's Settings has no record of what was set: its defaults are "online"
        # and False.
        if explicit is None and key in ("mode", "disabled") and value in ("online", False):
            continue
        values[key] = value
    return values


def _note_offline():
    global _noted_offline
    if not _noted_offline:
        _noted_offline = True
        metrics_file.note(
            "no W&B credentials (WANDB_API_KEY, a netrc entry or wandb.login(key=...)), so"
            " wandb runs offline; app still records the metrics"
        )


_wrappers = {}


def patch(wandb):
    # First what needs no mirror (the offline choice, the parameters), so it holds even
    # where this wandb's Run cannot be mirrored.
    _wrap_init(wandb)
    _wrap_login(wandb)
    _wrap_setup(wandb)
    from wandb.sdk import wandb_run

    if "log" not in vars(wandb_run.Run):
        raise RuntimeError(f"wandb {getattr(wandb, '__version__', '?')} has no Run.log to mirror")
    import inspect

    # Subclasses may take (*args, **kwargs); their calls are read with Run's own signature.
    define_metric_signature = inspect.signature(vars(wandb_run.Run)["define_metric"])
    _wrappers.update({
        "log": _wrap_log,
        "define_metric": functools.partial(_wrap_define_metric, signature=define_metric_signature),
        "finish": _wrap_finish,
        "_finish": _wrap_finish,
        "_summary_update_callback": _wrap_summary_update,
    })
    # NoopRun (mode="disabled", wandb 0.20 on) overrides log/finish/define_metric without
    # calling super.
    for run_class in [wandb_run.Run, *_subclasses(wandb_run.Run)]:
        for name, wrap in _wrappers.items():
            original = vars(run_class).get(name)
            if callable(original) and not getattr(original, "_app_capture_wrapped", False):
                wrapped = wrap(original)
                wrapped._app_capture_wrapped = True
                setattr(run_class, name, wrapped)


def _wrap_instance_overrides(wandb, run):
    """wandb 0.19's disabled run replaces log/finish/define_metric on the instance, and
    `wandb.log` is that replacement: wrap those too."""
    for name in ("log", "define_metric", "finish", "_finish"):
        current = vars(run).get(name)
        if not callable(current) or getattr(current, "_app_capture_wrapped", False):
            continue
        wrapped = _wrappers[name](lambda self, *args, _current=current, **kwargs: _current(*args, **kwargs))
        wrapped._app_capture_wrapped = True
        bound = types.MethodType(wrapped, run)
        vars(run)[name] = bound
        if getattr(wandb, name, None) is current:
            setattr(wandb, name, bound)


def _subclasses(cls):
    found = []
    for subclass in cls.__subclasses__():
        found += [subclass, *_subclasses(subclass)]
    return found


def _signature(function):
    import inspect

    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


def _wrap_init(wandb):
    real_init = wandb.init
    signature = _signature(real_init)

    @functools.wraps(real_init)
    def init(*args, **kwargs):
        try:
            offline_call = offline_init_arguments(signature, args, kwargs)
        except Exception as error:
            offline_call = None
            metrics_file.note(f"wandb's mode is left as it is (internal error: {error!r})")
        if offline_call is not None:
            _note_offline()
            args, kwargs = offline_call
        run = real_init(*args, **kwargs)
        try:
            _on_new_run(run)
            _wrap_instance_overrides(wandb, run)
        except Exception as error:
            metrics_file.turn_off(f"internal error after wandb.init: {error!r}")
        return run

    for holder in (wandb, sys.modules.get("wandb.sdk"), sys.modules.get("wandb.sdk.wandb_init")):
        if holder is not None and getattr(holder, "init", None) is real_init:
            holder.init = init


def _wrap_login(wandb):
    real_login = getattr(wandb, "login", None)
    if not callable(real_login):
        return
    signature = _signature(real_login)

    @functools.wraps(real_login)
    def login(*args, **kwargs):
        global _login_key_given
        key = _key_argument(signature, args, kwargs)
        try:
            result = real_login(*args, **kwargs)
        except Exception as error:
            if key or not _no_key_to_be_had(wandb, error):
                raise
            _note_offline()
            return False
        if key and result:
            _login_key_given = True
        return result

    for holder in (wandb, sys.modules.get("wandb.sdk"), sys.modules.get("wandb.sdk.wandb_login")):
        if holder is not None and getattr(holder, "login", None) is real_login:
            holder.login = login


def _wrap_setup(wandb):
    real_setup = getattr(wandb, "setup", None)
    if not callable(real_setup):
        return
    signature = _signature(real_setup)

    @functools.wraps(real_setup)
    def setup(*args, **kwargs):
        try:
            arguments = signature.bind(*args, **kwargs).arguments if signature else kwargs
            _setup_settings.update(
                (key, value) for key, value in _init_settings(arguments.get("settings")).items() if value is not None
            )
        except Exception:
            pass  # wandb.setup raises its own error, or we do without its settings
        return real_setup(*args, **kwargs)

    for holder in (wandb, sys.modules.get("wandb.sdk"), sys.modules.get("wandb.sdk.wandb_setup")):
        if holder is not None and getattr(holder, "setup", None) is real_setup:
            holder.setup = setup


def _key_argument(signature, args, kwargs):
    try:
        return signature.bind(*args, **kwargs).arguments.get("key") if signature else kwargs.get("key")
    except TypeError:
        return None


def _no_key_to_be_had(wandb, error):
    """Whether `error` is wandb.login's UsageError for want of an API key (no terminal to
    ask on) where wandb.init would run offline: no key anywhere and no mode of the user's."""
    try:
        usage_error = getattr(getattr(wandb, "errors", None), "UsageError", None)
        if not (isinstance(usage_error, type) and isinstance(error, usage_error)):
            return False
        environ = os.environ
        file_settings = _settings_files(environ)
        return not user_chose_mode(environ, file_settings, {}) and not has_credentials(environ, file_settings)
    except Exception:
        return False


def _on_new_run(run):
    if run is None:
        return
    run_params = params.load()
    if run_params:
        config = run.config
        merge = getattr(config, "merge_locked", None) or getattr(config, "update_locked", None)
        if merge is not None:
            merge(run_params, user="sweep", _allow_val_change=True)
        else:
            config.update(run_params, allow_val_change=True)
    _rules_for(run)
    metrics_file.shared().open()


def _rules_for(run):
    rules = vars(run).get("_app_capture_rules")
    if rules is None:
        # wandb prints its own warnings (a step below the current one), so none here.
        starting_step = getattr(run, "_starting_step", 0)
        rules = StepRules(metrics_file.shared(), warn=None, starting_step=starting_step if isinstance(starting_step, int) else 0)
        vars(run)["_app_capture_rules"] = rules
        atexit.register(_flush_at_exit, rules)
    return rules


def _flush_at_exit(rules):
    if not metrics_file.is_off():
        try:
            rules.finish()
        except Exception as error:
            metrics_file.turn_off(f"internal error at exit: {error!r}")


def _mirror(what, action):
    if metrics_file.is_off():
        return
    try:
        action()
    except Exception as error:
        metrics_file.turn_off(f"internal error mirroring {what}: {error!r}")


def _wrap_log(original):
    @functools.wraps(original)
    def log(self, *args, **kwargs):
        result = original(self, *args, **kwargs)

        def mirror():
            data = args[0] if args else kwargs.get("data")
            step = args[1] if len(args) > 1 else kwargs.get("step")
            commit = args[2] if len(args) > 2 else kwargs.get("commit")
            if isinstance(data, Mapping):
                _rules_for(self).log(data, None if step is None else operator.index(step), commit)

        _mirror("wandb.log", mirror)
        return result

    return log


def _wrap_define_metric(original, signature):
    @functools.wraps(original)
    def define_metric(self, *args, **kwargs):
        result = original(self, *args, **kwargs)

        def mirror():
            arguments = signature.bind(self, *args, **kwargs).arguments
            step_metric = arguments.get("step_metric")
            if step_metric is not None and not isinstance(step_metric, str):
                step_metric = step_metric.name  # a wandb_metric.Metric
            _rules_for(self).define_metric(
                arguments["name"], step_metric, arguments.get("step_sync"), arguments.get("overwrite")
            )

        _mirror("define_metric", mirror)
        return result

    return define_metric


def _wrap_finish(original):
    @functools.wraps(original)
    def finish(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            rules = vars(self).get("_app_capture_rules")
            if rules is not None:
                _mirror("finish", rules.finish)

    return finish


def _wrap_summary_update(original):
    """`run.summary[k] = v` and `summary.update` reach the run as one SummaryRecord."""

    @functools.wraps(original)
    def summary_update_callback(self, summary_record, *args, **kwargs):
        result = original(self, summary_record, *args, **kwargs)

        def mirror():
            data = {}
            for item in getattr(summary_record, "update", None) or ():
                key = item.key
                data[".".join(key) if isinstance(key, (tuple, list)) else str(key)] = item.value
            if data:
                _rules_for(self).summary(data)

        _mirror("summary", mirror)
        return result

    return summary_update_callback

