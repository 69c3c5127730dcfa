"""dapo-exp's Hydra launcher plugins: ``hydra/launcher=parallel`` (:mod:`.parallel_launcher`) and the
``SlurmLauncher`` of ``hydra/launcher=slurm`` (:mod:`.slurm_launcher`)."""
