"""The names a failed placement step carries: activities raise them; the workflow and Events read them.

Each is an `ApplicationError.type`. The workflow decides on them (wait for Slurm, or fail
with the reason), so they are domain, not I/O: one list, imported by both sides.
"""

KUBE_REJECTED = "KubernetesRejected"  # the API server refused; asking again cannot help
SLURM_REJECTED = "SlurmRejected"  # slurmrestd refused the job or the update
UNDECODABLE = "UndecodableAnswer"  # an answer that does not decode as what was asked for
SLURM_UNAVAILABLE = "SlurmUnavailable"  # Slurm confirmed away: the workflow waits for it
SLURM_BUSY = "SlurmBusy"  # Slurm takes no new job now (its job queue is full): submit later
