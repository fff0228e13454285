"""Dagster surface: thin wiring of the pipelines/ and state_store/ library into jobs, assets, schedules, sensors."""
