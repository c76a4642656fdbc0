"""The workflow through a real one-node Slurm (Debian's slurm-wlm + munge), not a mock.

Recipe: ../shared/specs/slurm_local.md, mode A (no accounting database: job status through
squeue) with one fake GPU (gres File=/dev/null) so the train rule's gpu=1 is accepted. The test
installs the packages when it may (root and apt-get; offline it skips, saying why), starts the
daemons, records their PIDs, runs the tiny workflow with the project's slurm profile, stops exactly
those PIDs, purges exactly the packages it installed and leaves /etc/slurm as it found it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import DEBIAN_FMNIST, ROOT, snakemake_cmd, subprocess_env, write_yaml

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SLURM_UP = r"""
set -euo pipefail
pidof_file() { for i in $(seq 100); do [ -s "$1" ] && break; sleep 0.2; done; cat "$1"; }
export DEBIAN_FRONTEND=noninteractive
NODE=$(hostname -s)
# nproc honours OMP_NUM_THREADS (scripts/test_each.py sets 1): the node would then refuse a 2-CPU group job
# for ever ("PartitionConfig")
CPUS=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
MEM=$(( $(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p') * 9 / 10 ))
# a private state folder: the queue holds only this test's jobs, never those of an earlier attempt
STATE=$(mktemp -d /var/tmp/fedrepro-slurm.XXXXXX)
echo "$STATE" > "$PIDFILE.state"
# the configuration this test writes replaces any found there for the test's length only (SLURM_DOWN)
mkdir -p /etc/slurm "$STATE/slurmctld" "$STATE/slurmd" "$STATE/etc" /var/log/slurm
for f in slurm.conf gres.conf; do [ -e "/etc/slurm/$f" ] && cp -p "/etc/slurm/$f" "$STATE/etc/$f"; done
echo written > "$PIDFILE.etc"
chmod 755 "$STATE"
chown slurm:slurm "$STATE/slurmctld" /var/log/slurm || true
echo "NodeName=$NODE Name=gpu File=/dev/null" > /etc/slurm/gres.conf
cat > /etc/slurm/slurm.conf <<EOF
ClusterName=ci
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=300
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
: > "$PIDFILE"
rm -f /run/slurmctld.pid /run/slurmd.pid
mkdir -p /run/munge && chown munge:munge /run/munge
rm -f /run/munge/munged.pid
runuser -u munge -- /usr/sbin/munged
echo "munged $(pidof_file /run/munge/munged.pid)" >> "$PIDFILE"
/usr/sbin/slurmctld
echo "slurmctld $(pidof_file /run/slurmctld.pid)" >> "$PIDFILE"
/usr/sbin/slurmd
echo "slurmd $(pidof_file /run/slurmd.pid)" >> "$PIDFILE"
for i in $(seq 60); do sinfo -h -o %T 2>/dev/null | grep -qx idle && break; sleep 0.5; done
sinfo -h -o %T | grep -qx idle || { tail -n 5 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log; exit 1; }
timeout 60 srun -t 1 hostname
"""

SLURM_DOWN = r"""
tac "$PIDFILE" | while read -r name pid; do
  kill "$pid" 2>/dev/null && echo "stopped $name ($pid)"
  for i in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
done
rm -f /run/slurmctld.pid /run/slurmd.pid
STATE=$(cat "$PIDFILE.state" 2>/dev/null || true)
# the configuration files: those found before the test come back, those the test wrote go
if [ -e "$PIDFILE.etc" ]; then
  for f in slurm.conf gres.conf; do
    if [ -n "$STATE" ] && [ -e "$STATE/etc/$f" ]; then
      cp -p "$STATE/etc/$f" "/etc/slurm/$f"
    else
      rm -f "/etc/slurm/$f"
    fi
  done
fi
[ -n "$STATE" ] && rm -rf "$STATE"
# Snakemake's Slurm executor plugin runs `scontrol show config` at every start of snakemake wherever
# Slurm's client tools are installed; with no controller that waits 10 s (its timeout) per call, so
# every later test that runs snakemake would pay it. Leave the machine as this test found it: purge
# exactly the packages the install added (listed by dpkg before and after), then the folders it made.
if [ -s "$PIDFILE.installed" ]; then
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $(cat "$PIDFILE.installed") >/dev/null \
    && echo "removed the packages this test installed: $(tr '\n' ' ' < "$PIDFILE.installed")"
fi
# the folders that did not exist before the test (made by the install, the daemons or SLURM_UP): the
# purge leaves those holding files it does not own (our configuration, the daemons' logs)
for d in $FRESH_DIRS; do rm -rf "$d"; done
true
"""

INSTALL = r"""
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
"""


def _pid_alive(pidfile: str) -> bool:
    try:
        os.kill(int(Path(pidfile).read_text().split()[0]), 0)
        return True
    except (OSError, ValueError, IndexError):
        return False


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if shutil.which("slurmctld") is None and (os.geteuid() != 0 or shutil.which("apt-get") is None):
        pytest.skip("Slurm is not installed and cannot be (needs root and apt-get)")
    if os.geteuid() != 0:
        pytest.skip("starting slurmctld/slurmd/munged needs root")
    if _pid_alive("/run/slurmctld.pid"):
        pytest.skip("a Slurm controller already runs on this machine; not reconfiguring it")
    import snakemake_executor_plugin_slurm  # noqa: F401  (a pinned dependency: its absence is a failure)

    pidfile = tmp_path_factory.mktemp("slurm") / "pids"
    fresh = [d for d in SLURM_DIRS if not Path(d).exists()]
    env = {**os.environ, "PIDFILE": str(pidfile), "FRESH_DIRS": " ".join(fresh)}
    etc_before = _listing(Path("/etc/slurm"))
    try:
        if shutil.which("slurmctld") is None or shutil.which("munged") is None:
            _install(pidfile)
        up = subprocess.run(["bash", "-c", SLURM_UP], env=env, capture_output=True, text=True, timeout=600)
        if up.returncode != 0:
            pytest.fail(f"could not start Slurm:\n{up.stdout[-2000:]}\n{up.stderr[-3000:]}")
        yield pidfile
    finally:
        down = subprocess.run(["bash", "-c", SLURM_DOWN], env=env, capture_output=True, text=True, timeout=300)
        assert _listing(Path("/etc/slurm")) == etc_before, f"/etc/slurm is not as the test found it\n{down.stderr}"
        assert not [d for d in fresh if Path(d).exists()], f"folders the test made outlived it\n{down.stderr}"


# folders Slurm's and munge's packages, daemons and this test create
SLURM_DIRS = (
    "/etc/slurm",
    "/var/log/slurm",
    "/var/lib/slurm",
    "/var/spool/slurmd",
    "/run/slurm",
    "/etc/munge",
    "/var/log/munge",
    "/var/lib/munge",
    "/run/munge",
)


def _listing(folder: Path) -> dict[str, bytes] | None:
    """Every file under ``folder`` with its content; None when the folder does not exist."""
    if not folder.is_dir():
        return None
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _packages() -> set[str]:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${db:Status-Status} ${Package}\n"], capture_output=True, text=True, timeout=60
    ).stdout
    return {line.split()[1] for line in out.splitlines() if line.startswith("installed ")}


def _install(pidfile: Path) -> None:
    """apt-get install slurm-wlm and munge, recording the packages it added for SLURM_DOWN to purge. A
    machine without a Debian mirror (offline) cannot run this test: it is skipped, saying so."""
    before = _packages()
    try:
        proc = subprocess.run(["bash", "-c", INSTALL], capture_output=True, text=True, timeout=900)
    finally:
        pidfile.with_name(pidfile.name + ".installed").write_text(
            "".join(f"{p}\n" for p in sorted(_packages() - before))
        )
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        pytest.skip(
            f"Slurm is not installed and apt-get could not install slurm-wlm and munge "
            f"(offline, or no Debian mirror?): {reason}"
        )


TINY = {
    "title": "Tiny Slurm check",
    "data": {"root": "data", "mirrors": {"fmnist": [str(DEBIAN_FMNIST) + "/"]}},
    "experiments": {
        "slurm_tiny": {
            "base": {
                "dataset": "fmnist",
                "model": "mlp",
                "num_clients": 4,
                "participation": 0.5,
                "rounds": 2,
                "batch_size": 256,
                "device": "cpu",
                "partition": {"kind": "iid", "seed": 1},
            },
            "grid": {"seed": [1, 2]},
        }
    },
}


def test_tiny_workflow_runs_through_sbatch(slurm, tmp_path, fmnist_data):
    params = write_yaml(tmp_path / "tiny.yaml", fmnist_data.params(TINY))
    cmd = [
        "timeout",
        "-s",
        "KILL",
        "540",
        *snakemake_cmd(
            tmp_path,
            "--configfile",
            str(params),
            "--workflow-profile",
            str(ROOT / "workflow/profiles/slurm"),
            # the site settings of this one-node test cluster replace the profile's placeholders
            "--default-resources",
            "slurm_partition=debug",
            "mem_mb=500",
            "runtime=10",
            "--slurm-status-command",
            "squeue",
            "--slurm-init-seconds-before-status-checks",
            "1",
            "--seconds-between-status-checks",
            "1",
            "--latency-wait",
            "5",
            "--jobs",
            "4",
            "--slurm-keep-successful-logs",
            "--verbose",
        ),
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=subprocess_env(f"sqlite:///{tmp_path / 'm.db'}", fmnist=fmnist_data),
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:  # what the queue says of the jobs: a job pending for a reason the node cannot meet
        queue = subprocess.run(
            ["bash", "-c", "sinfo -N -l; squeue -o '%i %T %r'; scontrol show job | grep -E 'JobId|JobState|TRES'"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        out += "\n--- queue ---\n" + queue.stdout + queue.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "sbatch call" in out, "jobs were submitted with sbatch"
    sbatch_lines = [line for line in out.splitlines() if "sbatch call" in line]
    # partition and the grouped training runs went to Slurm; download/report stayed local
    assert not any("'download'" in line or "allowed-rules download" in line for line in sbatch_lines)
    train_lines = [line for line in sbatch_lines if "rule_trainbatch_train" in line]
    assert len(train_lines) == 1, "both training runs share one submission (group trainbatch)"
    # device: cpu runs ask for no GPU (each would be an srun step waiting for the submission's one GPU);
    # the GPU request of device: auto/cuda runs is rendered in tests/ops/test_plan.py
    assert "--gpus" not in train_lines[0]
    logs = list((tmp_path / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert logs, "the slurm executor's job logs exist"
    jobs = subprocess.run(
        ["squeue", "--states=all", "-h", "-o", "%i %T"], capture_output=True, text=True, timeout=60
    ).stdout.split("\n")
    states = [line.split()[1] for line in jobs if line.strip()]
    assert states and all(s == "COMPLETED" for s in states), jobs
    assert len(list((tmp_path / "results" / "runs").glob("*/summary.json"))) == 2
    assert (tmp_path / "reports" / "tiny.html").exists()
