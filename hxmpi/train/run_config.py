"""``TrainConfig``: every setting of a training run, in one place, independent of the command line.

Its fields are generated from the schema (``hxmpi.schema.SETTINGS``: name, type, range, default, help),
and so are the CLI's flags (``hxmpi.train.command``, run as ``python -m hxmpi.train``). A TrainConfig checks itself when it is built, and
again when ``check`` is called (``Trainer`` does, in case fields were changed since): a bad value
or combination raises ``SettingError`` naming the setting, never a flag. Library code takes the
TrainConfig or the parts it needs (``staging_config()``, ``update_config()``), built by keyword
from the fields of the same names.
"""
from __future__ import annotations

from dataclasses import field, fields, make_dataclass

from ..data.staging import StagingConfig
from ..errors import SettingError
from ..schema import SETTINGS, check_fields
from .update_engine import UpdateConfig

__all__ = ["SettingError", "TrainConfig"]


class _TrainConfigBase:
    def __post_init__(self):
        self.check()

    @classmethod
    def from_namespace(cls, ns) -> "TrainConfig":
        """From an ``argparse.Namespace`` (or any object) with one attribute per field."""
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls)})

    def check(self) -> None:
        """Raise SettingError on a bad value (type, range, choice) or combination that needs no
        communicator."""
        check_fields(self)
        if self.b1 > self.b2:
            raise SettingError("b1", f"{self.b1} is above b2 ({self.b2}): the async band must lie below the "
                                     f"scaling one")
        if self.pretrain_time is not None:
            if self.target_accuracy is None:
                raise SettingError("pretrain_time", "needs a positive number of seconds and a target accuracy")
            if self.resume:
                raise SettingError("pretrain_time", "cannot be combined with resume")
        if self.resume and not self.checkpoint:
            raise SettingError("resume", "needs a checkpoint directory")

    def sub_config(self, cls, **changes):
        """A ``cls`` (a dataclass) from this config's fields of the same names; ``changes`` override."""
        mine = {f.name for f in fields(self)}
        return cls(**{**{f.name: getattr(self, f.name) for f in fields(cls) if f.name in mine}, **changes})

    def staging_config(self, **changes) -> StagingConfig:
        """The staging settings (``changes`` override fields of the result)."""
        return self.sub_config(StagingConfig, **{"progress": not self.quiet, **changes})

    def update_config(self) -> UpdateConfig:
        """The update-policy settings."""
        return self.sub_config(UpdateConfig)


def _field(s):
    if s.factory is not None or isinstance(s.default, list):
        return field(default_factory=s.make_default)  # a fresh object per config
    return field(default=s.default)


TrainConfig = make_dataclass(
    "TrainConfig", [(s.name, s.kind, _field(s)) for s in SETTINGS.values()], bases=(_TrainConfigBase,),
    namespace={"__doc__": "One training run's settings (seconds for times, bytes for sizes, samples for "
                          "batches): one field per entry of ``hxmpi.schema.SETTINGS``, checked when built.",
               "__module__": __name__})
