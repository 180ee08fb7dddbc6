"""Stream tags: each random quantity of a trace is drawn from its own stream of the seed,
so changing one knob (say num_requests) leaves the others' draws alone."""

ARRIVALS = 1
SHUFFLE = 2
LENGTHS = 3
GROUPS = 4
UNIQUE_IDS = 5  # token ids no other request shares (keyed by rid)
BLOCK_IDS = 6  # token ids of a prefix block (keyed by block id)
GROUP_IDS = 7  # token ids of a synthetic prefix group (keyed by group)
