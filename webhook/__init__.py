"""The slurm-bridge admission webhook: routes pods to Slurm and refuses what it cannot place.

`slurm-bridge webhook` (see `webhook.command`) serves AdmissionReview v1 over
HTTPS; `mutate` and `validate` are the pure decisions, `app` the ASGI app
around them. docs/webhook.md is the operator's guide.
"""
