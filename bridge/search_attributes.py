"""Custom search attributes: how operators find a placement in the Temporal UI.

Example queries: `PodNamespace = "team-a" AND PlacementPhase = "Failed"`,
`SlurmJobId = 1234`, `SlurmNodes = "gpu-7"`.
"""

from temporalio.common import SearchAttributeKey

POD_NAMESPACE = SearchAttributeKey.for_keyword("PodNamespace")
POD_NAME = SearchAttributeKey.for_keyword("PodName")
POD_UID = SearchAttributeKey.for_keyword("PodUID")
PLACEMENT_GROUP = SearchAttributeKey.for_keyword("PlacementGroup")
PLACEMENT_PHASE = SearchAttributeKey.for_keyword("PlacementPhase")
SLURM_JOB_ID = SearchAttributeKey.for_int("SlurmJobId")
SLURM_NODES = SearchAttributeKey.for_keyword_list("SlurmNodes")

ALL = (POD_NAMESPACE, POD_NAME, POD_UID, PLACEMENT_GROUP, PLACEMENT_PHASE, SLURM_JOB_ID, SLURM_NODES)
