"""LiveJobs: the jobs the job watcher follows, fed by the pod watcher."""

from worker.job_registry import LiveJobs

A = "placement/prod-a/team/pod-a/uid-a@gen-a"
B = "placement/prod-a/team/pod-b/uid-b@gen-b"


def test_track_is_idempotent_and_items_is_a_snapshot() -> None:
    jobs = LiveJobs()
    jobs.track(1, A)
    jobs.track(1, A)  # every pod event of every member tracks again
    jobs.track(2, B)

    snapshot = jobs.items()
    jobs.forget(2)

    assert snapshot == [(1, A), (2, B)]
    assert jobs.items() == [(1, A)]
    assert len(jobs) == 1
    assert 1 in jobs
    assert 2 not in jobs
    assert jobs.placement_of(1) == A
    assert jobs.placement_of(2) is None


def test_forget_unknown_job_is_fine() -> None:
    jobs = LiveJobs()
    jobs.forget(7)
    jobs.finished(7)
    assert jobs.items() == []


def test_a_finished_job_is_not_followed_again_until_forgotten() -> None:
    jobs = LiveJobs()
    jobs.track(1, A)

    jobs.finished(1)  # the watcher told the placement the job is over
    jobs.track(1, A)  # a later event of a pod still labelled with the job

    assert jobs.items() == []
    jobs.forget(1)  # no pod references it any more
    jobs.track(1, A)  # (only if some pod names it again)
    assert jobs.items() == [(1, A)]


def test_a_finished_job_id_naming_another_placement_is_followed() -> None:
    # Slurm hands out ids again after its state was wiped: another placement's job.
    jobs = LiveJobs()
    jobs.track(1, A)
    jobs.finished(1)

    jobs.track(1, B)

    assert jobs.items() == [(1, B)]


def test_the_newest_placement_for_a_job_wins() -> None:
    jobs = LiveJobs()
    jobs.track(1, A)
    jobs.track(1, B)
    assert jobs.items() == [(1, B)]


def test_retain_forgets_jobs_no_pod_references_after_a_relist() -> None:
    jobs = LiveJobs()
    for job_id in (1, 2, 3):
        jobs.track(job_id, A)
    jobs.finished(3)

    jobs.retain([2])

    assert jobs.items() == [(2, A)]
    jobs.track(3, A)  # forgotten, not finished any more: followed again
    assert sorted(jobs.items()) == [(2, A), (3, A)]


def test_memory_is_bounded_by_what_pods_reference() -> None:
    jobs = LiveJobs()
    for job_id in range(1000):
        jobs.track(job_id, f"placement/prod-a/ns/p{job_id}/u@g")
        jobs.finished(job_id)
        jobs.forget(job_id)
    assert len(jobs) == 0
    assert repr(jobs) == "LiveJobs(0 live, 0 finished)"


def test_the_version_moves_exactly_when_the_jobs_to_follow_change() -> None:
    # The job watcher derives its followed jobs again only when the version moved.
    jobs = LiveJobs()
    seen = [jobs.version]

    def moved() -> bool:
        seen.append(jobs.version)
        return seen[-1] != seen[-2]

    jobs.track(1, A)
    assert moved()
    jobs.track(1, A)  # every pod event tracks again
    assert not moved()
    jobs.track(1, B)  # the id names another placement now
    assert moved()
    jobs.finished(1)
    assert moved()
    jobs.track(1, B)  # a later event of a pod of the finished job
    assert not moved()
    jobs.forget(1)  # only finished: nothing followed changes
    assert not moved()
    jobs.track(2, A)
    jobs.retain([])
    assert moved()
    assert jobs.items() == []


def test_each_installation_gets_its_own_jobs_as_a_snapshot() -> None:
    jobs = LiveJobs()
    other = "placement/prod-b/team/pod-c/uid-c@gen-c"
    jobs.track(1, A)
    jobs.track(2, other)
    jobs.track(3, "not-a-placement-id")  # followed by no installation
    jobs.track(4, B)
    mine = jobs.of_installation("prod-a")
    jobs.finished(4)
    assert mine == {1: A, 4: B}
    assert jobs.of_installation("prod-a") == {1: A}
    assert jobs.of_installation("prod-b") == {2: other}
    jobs.track(2, B)  # the job's pods now name a prod-a placement
    assert jobs.of_installation("prod-b") == {}
    assert jobs.of_installation("prod-a") == {1: A, 2: B}
    jobs.forget(1)
    jobs.forget(2)
    jobs.forget(3)
    assert jobs.of_installation("prod-a") == {}
    assert len(jobs) == 0
