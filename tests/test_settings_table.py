"""Every setting is declared once (pipelines/config.py); README.md's table and the Dagster resource's fields and
descriptions are made from that declaration, and this fails when the README's copy is stale."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.config import ENV_ONLY_SETTINGS, SETTINGS, SessionsConfig
from pipelines.settings_table import TABLE_END, TABLE_START, readme_with_table, settings_table

pytestmark = pytest.mark.tier("pure")

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_table_is_the_settings():
    readme = README.read_text()
    assert readme.count(TABLE_START) == 1 and readme.count(TABLE_END) == 1
    assert readme_with_table(readme=readme) == readme, \
        "README.md's settings table differs from pipelines/config.py: python -m pipelines.settings_table README.md"


def test_every_setting_has_one_row_and_one_line():
    rows = settings_table().splitlines()[2:]
    assert [row.split(" | ")[0] for row in rows] == [f"| `{setting.env}`" for setting in SETTINGS]
    assert [setting.name for setting in SETTINGS] == list(SessionsConfig.__dataclass_fields__)
    for setting in SETTINGS:
        assert setting.about and setting.shown, setting.name
        assert "\n" not in setting.about + setting.shown and "|" not in setting.about + setting.shown, setting.name
    assert all(row.count(" | ") == 3 for row in rows)  # no cell broke the table


def test_dagster_shows_each_setting_as_declared():
    """The resource's config schema (what the launchpad shows): one field per setting run config may set, typed and
    described as declared; none for a secret or an environment-only one."""
    from assets.resources import SessionsResource

    schema = SessionsResource().get_resource_definition().config_schema.as_field().config_type.fields
    assert list(schema) == [setting.name for setting in SETTINGS if setting.in_run_config]
    for setting in SETTINGS:
        if setting.in_run_config:
            assert schema[setting.name].description == setting.description
            assert not schema[setting.name].is_required
    assert {"erasure_key", "kafka_conf", *ENV_ONLY_SETTINGS}.isdisjoint(schema)
    # Written out in assets/resources.py (what mypy sees): each field's type is its setting's kind, optional.
    assert {name: field.annotation for name, field in SessionsResource.model_fields.items()} == \
        {setting.name: setting.kind | None for setting in SETTINGS if setting.in_run_config}, \
        "assets/resources.py: SessionsResource's fields are not pipelines.config.SETTINGS (names, order, kinds)"
    assert SessionsResource.model_fields["gap_minutes"].description == \
        "SESSIONS_GAP_MINUTES: inactivity that ends a session (default: 30)"
