"""Tensor parallelism: one process per rank. Rank 0 (the run's own process) schedules and
broadcasts every step's prepared batch; every rank runs its model shard on it and samples
the same tokens from the gathered logits. Why rank 0 decides: one scheduler object means
ranks cannot drift apart (e.g. on an EOS that only one rank's float rounding sampled), and
the scheduler stays exactly the one the simulator drives."""
