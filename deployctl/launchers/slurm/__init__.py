"""The Slurm launcher (`launcher: slurm`): `launcher` its verbs, `batch` the batch script a
deployment runs as (pure); the host side is remote/slurm_jobs.py."""

from deployctl.launchers.slurm.launcher import SlurmJobLauncher

__all__ = ["SlurmJobLauncher"]
