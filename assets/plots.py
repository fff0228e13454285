"""Small pictures in asset metadata: text plots that Dagster's markdown shows as they are."""
from collections.abc import Sequence

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float]) -> str:
    """A text plot, oldest to newest, scaled between the series' own min and max."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1
    return "".join(_BARS[int((v - low) / span * (len(_BARS) - 1))] for v in values)


def series_table(title: str, labels: Sequence[str], series: dict[str, Sequence[float]]) -> str:
    """A markdown block: one row per series with its sparkline, min and max, under a title naming the range."""
    lines = [f"{title} ({labels[0]} .. {labels[-1]}):" if labels else title, "",
             "| series | oldest → newest | min | max |", "|---|---|---|---|"]
    for name, values in series.items():
        if values:
            lines.append(f"| {name} | `{sparkline(values)}` | {min(values):g} | {max(values):g} |")
    return "\n".join(lines)


def bar_table(title: str, values: dict[str, float], width: int = 30) -> str:
    """A markdown block: one row per value with a bar scaled to the largest."""
    top = max(values.values(), default=0) or 1
    lines = [title, "", "| | | count |", "|---|---|---|"]
    for name, value in values.items():
        lines.append(f"| {name} | `{'█' * round(value / top * width) or '·'}` | {value:g} |")
    return "\n".join(lines)
