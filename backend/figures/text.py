"""Data as text in a figure: Plotly renders a subset of HTML (<a href>, <b>, <br>, …) in titles, tick labels,
hovers and annotations, so every string that comes from data (tensor, config, host names; reasons, notes)
goes through `plain` before it is placed there."""

from __future__ import annotations

from html import escape


def plain(text: object) -> str:
    """`text` with &, < and > written as entities: Plotly shows them as those characters, never as markup."""
    return escape(str(text), quote=False)
