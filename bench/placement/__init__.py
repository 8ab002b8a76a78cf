"""Placement benchmark: the whole bridge on real Temporal and real Slurm, figures printed.

    .venv/bin/python -m bench.placement [--scenario batch|pending|site] [--pods N] [--foreign-jobs F] ...

Assembles what the end-to-end tests assemble (tests/e2e/harness.py): a real
Temporal dev server with the bridge's search attributes, real Slurm partitions
of the run's own (`SlurmTestBed.make_partition`, removed at the end), the fake
Kubernetes API in its own process with nodes named like the Slurm nodes, and
one in-process `Bridge` (worker and its watchers; node sync's Schedule is not
created) with the production defaults. The benchmark plays the kubelet.

Scenario `batch` (default), all in one batch on one server:

1. warm-up: a few placements, start to finish, not counted;
2. burst: N pods created, at most C at a time waiting to be bound (closed
   loop): throughput, and what each placement costs;
3. hold: all N pods bound and running for --hold seconds: memory with N
   placements in flight, and what waiting costs (with --recheck S the
   placements are told to re-check Slurm every S s, doubling, to measure it);
4. finish: pods turn Succeeded, paced at the measured placement rate;
5. paced: P more pods created at a fixed rate (open loop, 40 % of the burst
   rate): latency below saturation;
6. reference: N trivial workflows (3 no-op activities + 1 signal) at the same
   concurrency, for the ratio that survives a noisy machine.

Scenario `pending`: N pods wait in Slurm for capacity (a partition of one
1-CPU node, held by one running pod): memory and the watcher's cost with N
placements in flight; then probe pods that Slurm can start at once (a
partition of their own) show whether the waiting ones starve them.

Scenario `site` (site.py): the bridge at a site's size, measured at growing numbers
of live placements (--levels, default 100, 1,000 and 10,000 on 1,000 nodes of 5
CPUs: at 10,000, 5,000 run and 5,000 wait): at each level the job watcher's
requests, every process's CPU (and the Slurm daemons' with the watcher paused),
memory, actions while waiting, and probe pods' Slurm RUNNING -> bound.

--foreign-jobs F fills Slurm with F held jobs of another user before the run
and removes them after, for either scenario.

Costs are counted, not estimated: history events and billable actions from
each workflow's history, next to the dev server's `action` counter; Slurm
requests by a counting httpx transport (a listing of every job, `GET /jobs/`,
counted on its own); the bridge's Kubernetes requests by its client; CPU from
/proc; RUNNING from slurmctld's log (milliseconds). Timings are printed, never
asserted. The run is bounded (--timeout), stops when another test restarts
slurmctld under it, and always removes its partitions and foreign jobs.

The package, by role (`python -m bench.placement` runs `__main__.py`):

* `cli.py`: the command line (options, defaults, checks) and `main`;
* `driver.py`: one bounded run: the Slurm partitions and foreign jobs, the guard against a
  slurmctld restart, the clean-up that always runs;
* `stack.py`: `Bench`, which stands up Temporal, the fake Kubernetes API and the bridge, then runs
  the scenario, built on `site.py` (the site scenario) over `scenarios.py` (the batch and pending
  scenarios, their phases and figures) and `pods.py` (the user's and the kubelet's part: pods
  created, bound, Succeeded);
* `results.py`: the options and what a run measured; `environment.py`: the Slurm bed, the
  `temporal` binary and the machine the run stands on;
* `report.py` (the printed report, with `report_tables.py` and `report_site.py`),
  `report_json.py` (`--json`), and `figures.py` (figures both derive).
"""

from bench.placement.environment import TEMPORAL_CLI, connect_slurm

# bench/soak.py stands on the same Slurm bed and `temporal` binary.
__all__ = ["TEMPORAL_CLI", "connect_slurm"]
