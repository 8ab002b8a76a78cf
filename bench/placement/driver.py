"""One bounded run (`amain`): the Slurm partitions and foreign jobs it makes, `Bench` run under
--timeout and a guard against a slurmctld restart, and the clean-up that always runs."""

import asyncio
import contextlib
import time
from collections.abc import Sequence

from bench.placement.environment import connect_slurm, say
from bench.placement.results import Options, Results
from bench.placement.stack import Bench
from bench.probes import pids_by_comm
from testbed.slurm_bed import ENDED_STATES as ENDED
from testbed.slurm_bed import SlurmBedError, SlurmTestBed, TestPartition, wait_until


class Aborted(Exception):
    """The run could not finish: timed out, or Slurm was restarted under it."""


async def slurmctld_restarted(bed: SlurmTestBed, bench: Bench) -> str:
    """Returns when slurmctld restarts while placements are in flight (it forgets our partitions and
    kills their jobs, so they cannot finish); a restart at any other time is only noted."""
    chroot = bed.jwt_file.parent / "root"
    pid = next(iter(pids_by_comm("slurmctld", chroot)), None)
    while True:
        await asyncio.sleep(1)
        now = next(iter(pids_by_comm("slurmctld", chroot)), None)
        if now == pid:
            continue
        bench.slurm_restarted = True
        why = f"slurmctld was restarted (pid {pid} -> {now}; by another test run?)"
        if bench.placing:
            return why
        bench.results.notes.append(f"{why} outside the placement phases")
        pid = now


async def amain(o: Options) -> Results:
    bed = await asyncio.to_thread(connect_slurm)
    partitions: list[TestPartition] = []
    foreign: list[int] = []
    bench: Bench | None = None
    try:
        say(f"Slurm partition: {o.nodes} external nodes x {o.cpus} CPUs")
        partition = await asyncio.to_thread(
            bed.make_partition, nodes=o.nodes, cpus=o.cpus, memory_mb=o.memory_mb
        )
        partitions.append(partition)
        spare = None
        if o.scenario == "pending":
            spare = await asyncio.to_thread(bed.make_partition, nodes=1, cpus=1, memory_mb=o.memory_mb)
            partitions.append(spare)
        elif o.scenario == "site":  # the probes': free CPUs whatever the level
            spare = await asyncio.to_thread(bed.make_partition, nodes=2, cpus=4, memory_mb=o.memory_mb)
            partitions.append(spare)
        if o.foreign_jobs:
            say(f"submitting {o.foreign_jobs} foreign jobs (held, another user's)")
            started = time.monotonic()
            foreign = await asyncio.to_thread(bed.submit_foreign_jobs, o.foreign_jobs)
            say(f"{len(foreign)} foreign jobs submitted in {time.monotonic() - started:.1f} s")
        bench = Bench(o, bed, partition, spare)
        return await run_bounded(bench, bed, o.timeout)
    finally:
        # Synchronous on purpose: nothing can cancel it, after a timeout or ^C the clean-up still runs.
        if foreign:
            say(f"cancelling {len(foreign)} foreign jobs")
            try:
                bed.cancel_foreign_jobs(foreign)
            except SlurmBedError as error:
                say(f"WARNING: foreign jobs not all cancelled: {error}")
        for made in partitions:
            say(f"removing Slurm partition {made.name}")
            jobs = list(bench.activity_slurm.submitted) if bench is not None and bench.started else []
            restarted = bench is not None and bench.slurm_restarted
            remove_partition(bed, made, jobs, watch=90.0 if restarted else 0.0)


async def run_bounded(bench: Bench, bed: SlurmTestBed, timeout: float) -> Results:
    run = asyncio.create_task(bench.run(), name="bench")
    guard = asyncio.create_task(slurmctld_restarted(bed, bench), name="slurmctld guard")
    try:
        done, _ = await asyncio.wait({run, guard}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if run in done:
            return run.result()
        why = guard.result() if guard in done else f"timed out after --timeout {timeout:g} s"
        raise Aborted(f"{why}; progress: {bench.progress()}")
    finally:
        for task in (run, guard):
            task.cancel()
        await asyncio.gather(run, guard, return_exceptions=True)  # the bench's own clean-up runs here


def remove_partition(bed: SlurmTestBed, partition: TestPartition, jobs: Sequence[int], watch: float) -> None:
    """Cancel the partition's jobs, delete it and its nodes; then, for `watch` seconds, delete it again
    whenever it comes back (a test that restarts slurmctld re-creates the dynamic partitions it saw
    before the restart, ours included).

    The run's own jobs (`jobs`) are cancelled first by id, in one bulk request: `TestPartition.cleanup`
    lists every job in Slurm (`scontrol show job`), which takes minutes with tens of thousands of
    foreign jobs, and cancels one job per request.
    """
    with contextlib.suppress(SlurmBedError):
        live = [job_id for job_id, state in bed.job_states(jobs).items() if not ENDED.intersection(state)]
        bed.cancel_jobs(live)
        wait_until(
            lambda: not any(not ENDED.intersection(s) for s in bed.job_states(live).values()),
            "the run's jobs ended",
            timeout=30,
        )
    deadline = time.monotonic() + watch
    while True:
        try:
            bed.scontrol_quiet("delete", f"PartitionName={partition.name}")
            bed.delete_nodes(partition.node_names)
        except SlurmBedError:
            try:
                partition.cleanup()  # a job the run did not know of keeps a node busy
            except SlurmBedError as error:
                say(f"WARNING: partition {partition.name} not fully removed yet: {error}")
        while time.monotonic() < deadline:
            time.sleep(5)
            try:
                bed.scontrol("show", "partition", partition.name)
            except SlurmBedError:
                continue  # not there (or slurmctld is down): keep looking until the deadline
            say(f"partition {partition.name} came back; removing it again")
            break
        else:
            return
