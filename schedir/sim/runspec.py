"""Parse `schedir bench --configs` items into `SimConfig`s.

An item is `PIPELINE[@field=value]...`: PIPELINE is a preset name (`vllm`,
`base`) or a pass list written with `+` between passes (commas separate
items), e.g. `vllm,vllm@policy=priority,vllm@enable_prefix_caching=false`.
With `;` anywhere in the list, items are separated by `;` instead and pass
lists may use commas. Each item's text is its column label.
"""

from __future__ import annotations

import attrs

from schedir.sim.config import OVERRIDABLE, SimConfig

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigSpecError(ValueError):
    """A `--configs` item that cannot become a SimConfig (the message names the item)."""


def split_items(text: str) -> list[str]:
    sep = ";" if ";" in text else ","
    items = [item.strip() for item in text.split(sep)]
    if not items or any(not item for item in items):
        raise ConfigSpecError(f"--configs {text!r}: empty item (write e.g. 'vllm,vllm@policy=priority')")
    return items


def parse_item(item: str, base: SimConfig) -> SimConfig:
    """One item over the shared command-line settings in `base`."""
    head, *overrides = item.split("@")
    pipeline = head.strip().replace("+", ",")
    if not pipeline:
        raise ConfigSpecError(f"config {item!r}: no preset or pass list before '@'")
    changes: dict[str, object] = {"pipeline": pipeline, "label": item}
    fields = {a.name: a for a in attrs.fields(SimConfig)}
    for override in overrides:
        key, eq, value = override.partition("=")
        key = key.strip().replace("-", "_")
        if not eq:
            raise ConfigSpecError(f"config {item!r}: override {override!r} is not field=value")
        if key not in OVERRIDABLE or key in ("pipeline", "label"):
            allowed = ", ".join(k for k in OVERRIDABLE if k not in ("pipeline", "label"))
            raise ConfigSpecError(f"config {item!r}: unknown field {key!r} (one of: {allowed})")
        changes[key] = _coerce(item, key, value.strip(), fields[key].default)
    try:
        return attrs.evolve(base, **changes)
    except (TypeError, ValueError) as e:
        raise ConfigSpecError(f"config {item!r}: {e}") from None


def parse_configs(text: str, base: SimConfig) -> list[SimConfig]:
    configs = [parse_item(item, base) for item in split_items(text)]
    labels = [c.name for c in configs]
    if len(set(labels)) != len(labels):
        raise ConfigSpecError(f"--configs {text!r}: the same config twice")
    return configs


def _coerce(item: str, key: str, value: str, default: object) -> object:
    try:
        if isinstance(default, bool) or key == "enable_prefix_caching":  # (None: the engine's own choice)
            low = value.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(f"expected true or false, got {value!r}")
        if isinstance(default, int) or (default is None and key in ("max_model_len", "num_blocks")):
            expected = "an integer"
            return int(value)
        if isinstance(default, float):
            expected = "a number"
            return float(value)
        return value
    except ValueError as e:  # int() / float() say "invalid literal for int() with base 10": say what is expected
        detail = str(e) if isinstance(default, bool) or key == "enable_prefix_caching" else \
            f"expected {expected}, got {value!r}"
        raise ConfigSpecError(f"config {item!r}: {key}={value!r}: {detail}") from None
