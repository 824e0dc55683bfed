"""Slurm: a submitit executor whose submission file is Faultdrill's template."""
