"""Background work of a Gateway process: sweeper, scheduler, wake-ups, checkpoints."""
