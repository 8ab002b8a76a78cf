"""`python -m webhook`: the same command as `slurm-bridge webhook`."""

import typer

from webhook.command import webhook

if __name__ == "__main__":
    typer.run(webhook)
