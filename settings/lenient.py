"""Reading a settings object field by field, so one bad or unknown key costs only itself."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from settings.models import Settings


def read_lenient(data: dict[str, Any]) -> tuple[Settings, dict[str, Any], list[str]]:
    """(settings, kept, notes): the usable fields, the raw values that were not used (unknown keys,
    invalid values, a newer schema_version) to be written back as found, and one note for each."""
    values, kept, notes = _read(Settings, data, "")
    return Settings.model_validate(values), kept, notes


def _read(model: type[BaseModel], data: dict[str, Any], where: str
          ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in data.items():
        name = f"{where}{key}"
        field = model.model_fields.get(key)
        if field is None:
            kept[key] = value
            notes.append(f"unknown setting {name!r} ignored (kept in the file)")
            continue
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel) and isinstance(value, dict):
            values[key], inner_kept, inner_notes = _read(sub, value, f"{name}.")
            if inner_kept:
                kept[key] = inner_kept
            notes += inner_notes
            continue
        try:
            model.model_validate({key: value})  # every other field has a default
        except ValidationError as exc:
            kept[key] = value
            reason = exc.errors()[0]["msg"]
            if key == "schema_version":
                notes.append(f"schema_version {value!r} is not one this Lockstep reads ({reason}); known "
                             "settings used, the rest kept in the file")
            else:
                notes.append(f"{name}: {reason}; the default is in use (the file's value is kept)")
            continue
        values[key] = value
    return values, kept, notes
