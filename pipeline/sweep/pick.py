"""`--pick "kl<=0.02,artifact_bytes<=1GiB" --maximize tok_s_batch32`: the variant that meets
every constraint and is best on the objective, written as DIR/picked.yaml (its full recipe,
ready for `ingot build`); when none meets them, one line saying which constraint excluded the
closest ones."""

from __future__ import annotations

import operator
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import SweepError
from .results import Row

__all__ = [
    "FIELDS",
    "Constraint",
    "Objective",
    "objective_of",
    "parse_constraints",
    "pick",
    "write_picked",
]

PICKED = "picked.yaml"

# sweep.json's numeric fields: what a constraint or an objective may name.
FIELDS = (
    "kl",
    "perplexity",
    "perplexity_ood",
    "artifact_bytes",
    "tok_s_batch1",
    "tok_s_batch32",
    "ttft_ms_p50",
    "build_s",
    "peak_build_bytes",
)
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_CONSTRAINT = re.compile(r"\s*([a-z_0-9]+)\s*(<=|>=|<|>)\s*([0-9.eE+-]+)\s*([A-Za-z]*)\s*")


@dataclass(frozen=True, slots=True)
class Constraint:
    field: str
    op: str
    bound: float
    text: str  # as the user wrote it

    def holds(self, row: Row) -> bool:
        return _OPS[self.op](getattr(row, self.field), self.bound)

    def excess(self, row: Row) -> float:
        """How far `row` misses it, relative to the bound (0 when it holds)."""
        if self.holds(row):
            return 0.0
        return abs(getattr(row, self.field) - self.bound) / max(abs(self.bound), 1e-12)


@dataclass(frozen=True, slots=True)
class Objective:
    field: str = "kl"
    maximize: bool = False

    def key(self, row: Row) -> tuple:
        value = getattr(row, self.field)
        return (-value if self.maximize else value, row.kl, row.name)  # ties: quality, name


def field_name(name: str, option: str) -> str:
    """`name` if sweep.json has such a numeric field; SweepError naming `option` otherwise."""
    if name not in FIELDS:
        raise SweepError(f"{option}: unknown field {name!r} (fields: {', '.join(FIELDS)})")
    return name


def objective_of(maximize: str | None, minimize: str | None) -> Objective:
    """`--maximize F` / `--minimize F` (neither: the lowest kl)."""
    if maximize is not None:
        return Objective(field_name(maximize, "--maximize"), maximize=True)
    return Objective(field_name(minimize or "kl", "--minimize"))


def parse_constraints(text: str) -> list[Constraint]:
    """`field<=value,...`; a value may carry a byte unit (KB, MB, GB, KiB, MiB, GiB)."""
    constraints = []
    for part in (p for p in text.split(",") if p.strip()):
        match = _CONSTRAINT.fullmatch(part)
        if match is None:
            raise SweepError(
                f"--pick: {part.strip()!r} is not FIELD<=VALUE (or >=, <, >), e.g. "
                "kl<=0.02,artifact_bytes<=1GiB"
            )
        name, op, number, unit = match.groups()
        if unit not in _UNITS:
            raise SweepError(f"--pick: {part.strip()!r}: unknown unit {unit!r}")
        try:
            bound = float(number) * _UNITS[unit]
        except ValueError:
            raise SweepError(f"--pick: {part.strip()!r}: {number!r} is not a number") from None
        constraints.append(Constraint(field_name(name, "--pick"), op, bound, part.strip()))
    return constraints


def pick(rows: Sequence[Row], constraints: Sequence[Constraint], objective: Objective) -> Row:
    """The built row meeting every constraint that is best on `objective`."""
    built = [r for r in rows if r.error is None]
    if not built:
        raise SweepError("--pick: no variant was built (sweep.json lists why)")
    meeting = [r for r in built if all(c.holds(r) for c in constraints)]
    if meeting:
        return min(meeting, key=objective.key)
    raise SweepError(_nothing_meets(built, constraints))


def _nothing_meets(built: Sequence[Row], constraints: Sequence[Constraint]) -> str:
    """The closest variants are those missing the fewest constraints, by the least relative
    excess; the message names the constraint(s) they miss and their values."""

    def distance(row: Row) -> tuple[int, float]:
        missed = [c for c in constraints if not c.holds(row)]
        return len(missed), sum(c.excess(row) for c in missed)

    closest = sorted(built, key=distance)
    closest = [r for r in closest if distance(r)[0] == distance(closest[0])[0]][:3]
    missed = [c for c in constraints if any(not c.holds(r) for r in closest)]
    values = ", ".join(
        f"{r.name} ("
        + ", ".join(f"{c.field} {_number(getattr(r, c.field))}" for c in missed if not c.holds(r))
        + ")"
        for r in closest
    )
    excluded = " and ".join(c.text for c in missed)
    return (
        f"--pick: no variant meets {','.join(c.text for c in constraints)}: {excluded} "
        f"excluded the closest, {values}"
    )


def _number(value: float) -> str:
    return f"{value:.4g}"


def write_picked(out: Path, row: Row) -> Path:
    """DIR/picked.yaml: the variant's recipe file byte for byte (its paths are absolute), so
    `ingot build` makes the artifact the sweep measured, from the same cached stages."""
    path = out / PICKED
    shutil.copyfile(out / row.recipe, path)
    return path
