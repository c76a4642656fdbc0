"""The parity harness: the authors' code and fedrepro, compared step by step on generated inputs.

Given the path of a checkout of an authors' repository (never copied into the project), the harness imports
that code unchanged and out of tree through a shim (``shim``: CUDA to CPU, the modules its HEAD imports but
this machine lacks, its top-level module names kept apart from another checkout's), builds both programs' pieces
from the same generated inputs and compares them: the model as a function (``models``), a partition draw
(``partitions``), one server step (``servers``). Each check writes a record (``records``) with the code's commit,
the command and the numbers; ``matrix`` renders docs/parity.md's matrix from the records.

Nothing here is imported by a run: the harness is outside every run's hashed code (identity.run_code)."""
