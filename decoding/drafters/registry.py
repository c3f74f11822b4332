"""The registry of drafters: `DRAFTERS` maps a method's name to its drafter class, in the order
the page and the command line list them. The one place a drafter is looked up: a drafter module
registers its class with `register`; an unknown name is refused with one line (`drafter_class`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import DecodingError
from ..model import LoadedModel
from ..settings import OPTION_NAMES, PLAIN, DecodeSettings, Setting
from .base import Drafter

DRAFTERS: dict[str, type[Drafter]] = {}


def register(cls: type[Drafter]) -> type[Drafter]:
    """Make `cls` a drafter every part of the project offers (a class decorator)."""
    if not isinstance(cls, type) or not issubclass(cls, Drafter):
        raise DecodingError(f"register takes a Drafter subclass (a class decorator), not {cls!r}")
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        raise DecodingError(f"drafter {cls.__name__} needs a name: the method's name, e.g. name = 'my-drafter'")
    taken = {setting.name for other in DRAFTERS.values() if other is not cls for setting in other.settings}
    clash = taken & {setting.name for setting in cls.settings}
    if cls.name == PLAIN or clash:
        raise DecodingError(f"drafter {cls.name!r} takes a name already in use: {cls.name if not clash else clash}")
    DRAFTERS[cls.name] = cls
    OPTION_NAMES.update(setting.name for setting in cls.settings)
    return cls


def unregister(name: str) -> None:
    """Forget the drafter called `name` (a test's own drafter, once the test is done)."""
    cls = DRAFTERS.pop(name)
    OPTION_NAMES.difference_update(setting.name for setting in cls.settings)


def methods() -> list[str]:
    """Every method a run can name: plain decoding, then each drafter."""
    return [PLAIN, *DRAFTERS]


def drafter_class(name: object) -> type[Drafter]:
    """The drafter called `name`, or a DecodingError listing those there are."""
    if not isinstance(name, str) or name not in DRAFTERS:
        raise DecodingError(f"no drafter is called {name!r}: the drafters are {', '.join(DRAFTERS)} "
                            f"(and {PLAIN} is plain decoding)")
    return DRAFTERS[name]


def drafter_setting(name: str) -> Setting | None:
    """The drafter setting called `name`, whichever drafter owns it."""
    return next((s for cls in DRAFTERS.values() for s in cls.settings if s.name == name), None)


def setting_high(lm: LoadedModel, setting: Setting) -> int | float:
    """The highest value `setting` takes on `lm`: its own limit, or the model's where it bounds it."""
    if not setting.model_bound:
        return setting.high
    return next(cls for cls in DRAFTERS.values() if setting in cls.settings).model_limit(lm, setting)


def _check_model(lm: object) -> None:
    """A model not loaded yet (None) or only named is refused in one line. Anything else is taken
    for a model: stand-ins with a LoadedModel's fields are asked too (the page's tests)."""
    if lm is None or isinstance(lm, str | Path):
        raise DecodingError(f"a drafter runs on a loaded model (what load_model returns), not {lm!r}")


def available_drafters(lm: LoadedModel) -> list[str]:
    """The drafters `lm` can run: those that need heads, a draft model... only where it has them."""
    _check_model(lm)
    return [name for name, cls in DRAFTERS.items() if cls.available(lm)]


def check_settings(settings: DecodeSettings) -> DecodeSettings:
    """The one validation of a run's settings: a copy with every value checked (DecodingError
    in one line otherwise), and its drafter's unset options filled with their defaults."""
    if not isinstance(settings, DecodeSettings):
        raise DecodingError(f"settings must be a DecodeSettings, not {settings!r}")
    checked = dataclasses.replace(settings, options=dict(settings.options))
    if checked.method != PLAIN:
        drafter_class(checked.method)
    checked.check_common()
    for name, value in checked.options.items():
        setting = drafter_setting(name)
        if setting is None:
            raise DecodingError(f"no drafter has a setting {name!r}")
        # None is an option left unset, as DecodeSettings says: its drafter's default (below).
        checked.options[name] = None if value is None else setting.check(value)
    if checked.method != PLAIN:
        for setting in DRAFTERS[checked.method].settings:
            if checked.options.get(setting.name) is None:
                checked.options[setting.name] = setting.default
    return checked


def make_drafter(lm: LoadedModel, settings: DecodeSettings) -> Drafter:
    """The drafter a run's method names, set up for `lm`."""
    _check_model(lm)
    cls = drafter_class(settings.method)
    if not cls.available(lm):
        raise DecodingError(cls.missing(lm))
    return cls.create(lm, check_settings(settings))
