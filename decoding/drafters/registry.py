"""The registry of drafters: `DRAFTERS` maps a method's name to its drafter class, in the order
the page and the command line list them. The one place a drafter is looked up: a drafter module
registers its class with `register`; an unknown name is refused with one line (`drafter_class`).
"""

from __future__ import annotations

import dataclasses

from ..errors import DecodingError
from ..model import LoadedModel
from ..settings import OPTION_NAMES, PLAIN, DecodeSettings, Setting
from .base import Drafter

DRAFTERS: dict[str, type[Drafter]] = {}


def register(cls: type[Drafter]) -> type[Drafter]:
    """Make `cls` a drafter every part of the project offers (a class decorator)."""
    taken = {setting.name for other in DRAFTERS.values() if other is not cls for setting in other.settings}
    clash = taken & {setting.name for setting in cls.settings}
    if cls.name == PLAIN or clash:
        raise ValueError(f"drafter {cls.name!r} takes a name already in use: {cls.name if not clash else clash}")
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


def available_drafters(lm: LoadedModel) -> list[str]:
    """The drafters `lm` can run: those that need heads, a draft model... only where it has them."""
    return [name for name, cls in DRAFTERS.items() if cls.available(lm)]


def check_settings(settings: DecodeSettings) -> DecodeSettings:
    """The one validation of a run's settings: a copy with every value checked (DecodingError
    in one line otherwise), and its drafter's unset options filled with their defaults."""
    checked = dataclasses.replace(settings, options=dict(settings.options))
    if checked.method != PLAIN:
        drafter_class(checked.method)
    checked.check_common()
    for name, value in checked.options.items():
        setting = drafter_setting(name)
        if setting is None:
            raise DecodingError(f"no drafter has a setting {name!r}")
        checked.options[name] = setting.check(value)
    if checked.method != PLAIN:
        for setting in DRAFTERS[checked.method].settings:
            if checked.options.get(setting.name) is None:
                checked.options[setting.name] = setting.default
    return checked


def make_drafter(lm: LoadedModel, settings: DecodeSettings) -> Drafter:
    """The drafter a run's method names, set up for `lm`."""
    cls = drafter_class(settings.method)
    if not cls.available(lm):
        raise DecodingError(cls.missing(lm))
    return cls.create(lm, check_settings(settings))
