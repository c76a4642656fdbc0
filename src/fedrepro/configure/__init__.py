"""What a run is, before any job: params files, the schema, the registry of methods and kinds (assembled from
their fragments), settings resolved and checked, grids expanded with their tunings and forks (``expansion``),
the manifest. Never imports torch or the training code (tests/project/test_import_rules.py)."""
