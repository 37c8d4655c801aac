"""RecipeError and the translation of pydantic's ValidationError into one line per problem.

A line reads `<file>: <dotted.field.path>: <what is wrong> (got <bad value>; allowed: <...>)`.
The dotted path is pydantic's `loc` with the discriminated-union tags removed: pydantic reports
`('quantize', 0, 'rtn', 'bits')`, the user wrote `quantize[0].bits`, so we show `quantize.0.bits`.
To know which `loc` segment is a tag (and which fields a model allows) we walk the model types
along the `loc`; nothing here knows the recipe's models by name.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Discriminator, Tag, ValidationError
from pydantic.fields import FieldInfo

from ingot.common.errors import IngotError

__all__ = ["RecipeError", "format_validation_error", "format_problem"]

_MAX_VALUE_REPR = 80

# pydantic's wording for these is generic ("Extra inputs are not permitted"); ours names the fix.
_MESSAGES = {
    "extra_forbidden": "unknown field",
    "missing": "required field missing",
}
# For these the "bad value" pydantic reports is the enclosing mapping, not the culprit.
_NO_GOT = {
    "extra_forbidden",
    "missing",
    "union_tag_not_found",
    "calibration_missing",
    "evaluate_speculative",
    "engine_target",
}


class RecipeError(IngotError):
    """A recipe that cannot be built; `problems` holds one human-readable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def format_problem(
    path: str,
    what: str,
    got: Any = None,
    allowed: str | None = None,
    *,
    file: str | None = None,
    show_got: bool = True,
) -> str:
    """One problem line; `got` and `allowed` are appended in parentheses when given."""
    notes = []
    if show_got:
        notes.append(f"got {_short_repr(got)}")
    if allowed:
        notes.append(f"allowed: {allowed}")
    line = f"{path}: {what}" if path else what
    if notes:
        line += f" ({'; '.join(notes)})"
    return f"{file}: {line}" if file else line


def format_validation_error(error: ValidationError, file: str, root: type[BaseModel]) -> list[str]:
    """Every error of `error` (raised validating `root`) as a problem line prefixed by `file`."""
    return [_format_one(e, file, root) for e in error.errors()]


def _format_one(err: Any, file: str, root: type[BaseModel]) -> str:
    kind, loc, ctx = err["type"], tuple(err["loc"]), err.get("ctx") or {}
    shown, _ = _walk(root, loc)
    what = _MESSAGES.get(kind, err["msg"])
    allowed = ctx.get("allowed")
    if kind == "extra_forbidden":
        _, parent = _walk(root, loc[:-1])
        allowed = ", ".join(_fields_of(parent))
        what += _for_member(root, loc[:-1])
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        # The tag field itself is where the user must look: quantize.0.method, not quantize.0.
        tag_field = ctx["discriminator"].strip("'")
        shown = [*shown, tag_field]
        _, union = _walk(root, loc)
        allowed = ", ".join(_tags_of(union))
        what = f"unknown {tag_field}" if kind == "union_tag_invalid" else _MESSAGES["missing"]
    got = ctx["tag"] if kind == "union_tag_invalid" else err.get("input")
    path = ".".join(str(s) for s in shown)
    return format_problem(path, what, got, allowed, file=file, show_got=kind not in _NO_GOT)


def _for_member(root: type[BaseModel], loc: tuple) -> str:
    """The suffix `for method rtn` (after a space) when `loc` ends in the tag of a union
    discriminated by a field: a field only another member has (speculative.draft under method
    ngram) is unknown to this one, not to the section."""
    if not loc or not isinstance(loc[-1], str):
        return ""
    _, union = _walk(root, loc[:-1])
    _, meta = _split_annotated(union) if union is not None else (None, [])
    fields = [m.discriminator for m in meta if isinstance(m, FieldInfo)]
    return f" for {fields[0]} {loc[-1]}" if fields and isinstance(fields[0], str) else ""


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_VALUE_REPR else text[: _MAX_VALUE_REPR - 3] + "..."


# -- walking the model types along a pydantic `loc` ------------------------------------------


def _walk(root: Any, loc: tuple) -> tuple[list[str | int], Any]:
    """(the loc as shown to the user, the annotation found at the end of loc or None)."""
    shown: list[str | int] = []
    tp = root
    for seg in loc:
        if tp is None:
            shown.append(seg)
            continue
        base, meta = _split_annotated(tp)
        if _is_discriminated(meta) and isinstance(seg, str):
            tp = _member_for_tag(base, seg)  # a union tag: not something the user wrote
            continue
        shown.append(seg)
        tp = _step_into(base, seg)
    return shown, tp


def _step_into(tp: Any, seg: str | int) -> Any:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(seg) if isinstance(seg, str) else None
        return field.rebuild_annotation() if field else None
    if get_origin(tp) in (list, tuple) and isinstance(seg, int):
        return get_args(tp)[0]
    return None


def _split_annotated(tp: Any) -> tuple[Any, list]:
    meta: list = []
    while True:
        if get_origin(tp) is Annotated:
            meta.extend(tp.__metadata__)
            tp = tp.__origin__
        elif (inner := _optional_of(tp)) is not None:
            tp = inner  # `X | None`: pydantic's loc goes straight into X
        else:
            return tp, meta


def _optional_of(tp: Any) -> Any:
    """X of `X | None`, else None."""
    if get_origin(tp) not in (Union, types.UnionType):
        return None
    members = [m for m in get_args(tp) if m is not type(None)]
    return members[0] if len(members) == 1 and len(get_args(tp)) == 2 else None


def _is_discriminated(meta: list) -> bool:
    return any(
        isinstance(m, Discriminator) or (isinstance(m, FieldInfo) and m.discriminator is not None)
        for m in meta
    )


def _members(union: Any) -> list[Any]:
    if get_origin(union) in (Union, types.UnionType):
        return list(get_args(union))
    return [union]


def _member_tags(member: Any) -> list[str]:
    base, meta = _split_annotated(member)
    tags = [m.tag for m in meta if isinstance(m, Tag)]
    if tags or not (isinstance(base, type) and issubclass(base, BaseModel)):
        return tags
    # Discriminated by a field: the member's tag is the value of its Literal-typed field.
    for field in base.model_fields.values():
        if get_origin(field.annotation) is Literal and field.is_required():
            return [str(v) for v in get_args(field.annotation)]
    return []


def _member_for_tag(union: Any, tag: str) -> Any:
    for member in _members(union):
        if tag in _member_tags(member):
            return _split_annotated(member)[0]
    return None


def _tags_of(tp: Any) -> list[str]:
    base, _ = _split_annotated(tp) if tp is not None else (None, [])
    return [t for m in _members(base) for t in _member_tags(m)] if base is not None else []


def _fields_of(tp: Any) -> list[str]:
    base, _ = _split_annotated(tp) if tp is not None else (None, [])
    if isinstance(base, type) and issubclass(base, BaseModel):
        return list(base.model_fields)
    return []
