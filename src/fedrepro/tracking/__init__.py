"""MLflow as a live index of runs. The run's files are the truth; tracking only mirrors them.

Two writers, one MLflow run per run folder (found again by its tag ``fedrepro.run``):

- ``live.LiveRun``, the training job's observer, opens the run when training starts (or continues it on a
  resume), buffers each round's metrics with the round as step and its real wall-clock time, sends
  them in one ``log_batch`` every ``FLUSH_SECONDS``, and at the end logs the summary, the model and
  the figures and sets the real end time and status. Its first failure (a dead server, a locked
  sqlite) switches it off for the rest of the run and leaves ``mlflow.json`` in the run folder
  saying so; it never raises into the training loop.
- ``reconcile.reconcile_run`` (the ``track`` step) brings a run's MLflow record in line with its files: it
  creates it, finishes a run that a fault left half logged (metrics are re-sent with the same
  timestamps, which MLflow deduplicates), deletes duplicates a killed registration left, and records
  the run's membership in params files and experiments.

Grouping: an MLflow experiment per params file (``<prefix>/<params name>``) and a parent run per
experiment of that file, the runs nested under it. A run folder is content-addressed and may belong
to several params files; its MLflow run lives where it was first logged, and every experiment it
belongs to is listed in its tag ``fedrepro.experiments`` (filter with ``tags.`fedrepro.experiments`
LIKE '%name%'``). Unset settings (None) are not logged as parameters at all.

``store`` opens the store and its experiments, ``record`` writes one run's record and its marker, ``live`` and
``reconcile`` are the two writers. No module a run executes imports this wing: the trainer hears of an observer.
"""
