"""What reads finished runs and shows them: the report pages, the papers' tables and claims beside ours, the
verification matrix, kept evidence, and the papers' analysis figures. Nothing a run executes imports this wing,
so no edit here renames a run."""
