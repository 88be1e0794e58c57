"""The YAML data files imgbuild ships and reads (the components' release lists, nccl-tests' bandwidth figures): one
rule for reading one and checking it against its pydantic model, with an error naming the file, the key and what was
expected, raised as the caller's error class (its exit code)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError, model_validator

from imgbuild.core.errors import ImgbuildError

Text = Annotated[str, StringConstraints(strict=True, min_length=1)]


class Sourced(BaseModel):
    """A fact a shipped data file holds: `source` says where it was read; `inferred: true` with `why` where nobody
    read it in a source (what was not read, and what the value rests on)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    source: Text
    inferred: bool = False
    why: Text | None = None

    @model_validator(mode="after")
    def _inferred_says_why(self) -> Sourced:
        if self.inferred and self.why is None:
            raise ValueError("inferred: true needs `why` (what was not read, and what the value rests on)")
        if self.why is not None and not self.inferred:
            raise ValueError("`why` is for an inferred row: set inferred: true, or drop why")
        return self


M = TypeVar("M", bound=BaseModel)

# libyaml's parser where PyYAML was built with it (the release lists are read at import: about 30 ms in Python's)
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(path: Path, model: type[M], error: type[ImgbuildError], what: str) -> M:
    """`path` read as YAML and checked against `model`; `error` (naming the file, and each wrong key with what was
    expected) when it cannot be read, is not YAML or does not fit. `what` says what the file is ("the release list")."""
    try:
        data = yaml.load(path.read_text(), Loader=_SafeLoader)
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if not str(p).startswith('function-')) or '(top level)'}: {e['msg']}"
            for e in exc.errors()
        )
        raise error(f"{path}: {problems}") from None
