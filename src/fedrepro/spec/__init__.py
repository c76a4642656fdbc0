"""What a run is, before any job: params files, the schema, settings resolved and checked, grids expanded
with their tunings and forks, the manifest. Never imports torch or the training code (tests/test_import_rules.py)."""
