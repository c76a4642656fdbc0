"""One federated run (the run wing): what a training job executes, and nothing that plans or names runs.

    jobs         train a run; give a child the state of a parent's first rounds
    trainer      the round loop: configure the round, train the cohort, aggregate, observe
    inputs       data, partition, validation / hold-out / proxy splits, label corruption, class shares, groups
    cohorts      the clients of a round, drawn from (seed, round)
    client       one client's local SGD (the sequential reference)
    batched      a round's clients trained together (vmapped), equal to the sequential path
    batchable    whether a model, data set and method can train batched
    batched_draws  the global generator's draws a batched round makes ahead, in the sequential order
    rows         a round's metrics row; divergence
    observers    metrics rows, snapshots, cosines, Hessian, checkpoints: each declares the state it keeps
    fork_states  a parent's kept states and a child's start from one
    checkpoint   the checkpoint file format; hessian: Lanczos on Hessian-vector products
    process      the device a job trains on; its tie to the parent process
    rundir       a run folder's files and state (outside every run id: where files lie, not what is computed)
    provenance   what a summary records about its origin: machine, accelerator, commit (outside every run id)

It never imports the settings wing (``fedrepro.configure``): a job receives a resolved setting. The run's
identity covers the modules here that a run executes (``identity.run_code``), not rundir and provenance
(``identity.OUTSIDE_RUNS``).
"""
