"""dapo-exp: ablations of GRPO and the DAPO fixes, from a CPU toy to a SLURM cluster."""

__version__ = "0.1.0"
