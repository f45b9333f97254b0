"""Limits of the scenario format and the field types that carry them (pure).

Every value a scenario file can give has a stated bound (docs/reference/scenario-files.md,
"Limits"), so that what validates also starts, runs and is written down (a spawned
environment, torch's timedelta, test ids, evidence paths). The schema, the faults and the
triggers all take their types from here.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Tuple, Union

from pydantic import AfterValidator, BeforeValidator, Field, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

# -- limits ----------------------------------------------------------------------------------
MAX_WORLD = 128          # processes in one run: ranks on every host plus ranks a fault adds
MAX_HOSTS = 16           # hosts (network namespaces) in one run
MAX_SECONDS = 86400.0    # any duration: timeout, deadline, delays, times, windows (one day)
MIN_TIMEOUT = 0.001      # torch counts its timeout in milliseconds: less would be 0
MAX_NAME = 64            # name and case id: they become test ids and evidence folder names
MAX_TEXT = 65536         # about
MAX_SHORT = 1024         # message patterns, exception names, phases, version ranges
MAX_ADDR = 253           # an address or host name (DNS's own limit)
MAX_ENV_VARS = 256       # env entries
MAX_ENV_VALUE = 32768    # bytes of one env value (UTF-8)
MAX_ENV_TOTAL = 131072   # bytes of all env names and values together
MAX_FAULTS = 64          # faults in one case
MAX_EXPECT_BLOCKS = 16   # torch-scoped expect blocks
MAX_STEPS = 256          # workload steps
MAX_MODEL_MB = 65536     # the model of a ddp entry (MiB)
MAX_TRAIN_STEPS = 100000  # training steps in one workload
MAX_MARKS = 32           # marks
MAX_REPEAT = 100         # runs of one case (repeat: / --harness-repeat)
MIN_RACE_REPEAT = 10     # runs of a race case (race: + repeat:): fewer measure no frequency

# -- reusable field types --------------------------------------------------------------------


def no_bool(v: Any) -> Any:
    if isinstance(v, bool):   # pydantic would read yes/true as 1 and no/false as 0
        raise ValueError("YAML reads this as a boolean (yes/no/on/off/true/false), not a number")
    return v


# a duration in seconds: finite, 0 <= s <= MAX_SECONDS (a boolean is refused, not read as 0/1)
Seconds = Annotated[float, BeforeValidator(no_bool),
                    Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
PositiveSeconds = Annotated[float, BeforeValidator(no_bool),
                            Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
Number = Annotated[float, BeforeValidator(no_bool), Field(allow_inf_nan=False)]
Port = Annotated[int, Field(ge=1, le=65535)]
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def _env_name(v: str) -> str:
    if not ENV_NAME_RE.fullmatch(v) or len(v) > MAX_SHORT:
        raise ValueError("not an environment variable name: letters, digits and _, not starting "
                         "with a digit (no '=', NUL or space)")
    return v


def _env_value(v: str) -> str:
    if "\0" in v:
        raise ValueError("an environment value cannot hold a NUL character (\\0): no process "
                         "could be started with it")
    n = len(v.encode("utf-8", "surrogatepass"))
    if n > MAX_ENV_VALUE:
        raise ValueError(f"an environment value of {n} bytes: at most {MAX_ENV_VALUE}")
    return v


EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[str, AfterValidator(_env_value)]


def env_as_text(v: Any) -> Any:
    """Numbers in env become text (``A: 5`` is ``"5"``); booleans and lists do not."""
    if isinstance(v, dict):
        return {k: (str(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x)
                for k, x in v.items()}
    return v


def located(field: Union[str, Tuple[Union[str, int], ...]], msg: str) -> PydanticCustomError:
    """A model-level error that the loader locates at ``field`` (pydantic gives it no loc): a
    field's name, or its path (``("hosts", 1, "knows")``)."""
    return PydanticCustomError("located", "{msg}", {"field": field, "msg": msg})


def _target(v: Any) -> Union[int, str]:
    """A process a fault acts on: a rank number, or a label ("agent:node1", "1@1"); whether
    the run can have it is ``Fault.check, the loader``'s (it sees the scenario)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and 0 < len(v) <= 64 and v.isprintable():
        return int(v) if v.isdigit() else v
    raise ValueError("a rank number, or the label of a process such as 'agent:node1' or '1@1'")


# a rank number or a process label, one error location (no union branch in it)
Target = Annotated[Union[int, str], PlainValidator(_target), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "maxLength": 64}]})]
