"""dapo-exp's Hydra launcher plugin: ``hydra/launcher=parallel`` (:mod:`.parallel_launcher`)."""
