"""dapo-exp's Hydra sweeper plugin: ``hydra/sweeper=sequential`` (:mod:`.sequential_sweeper`)."""
