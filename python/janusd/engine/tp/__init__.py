"""engine/tp: tensor parallelism. A model with tp = N runs as N shards, one process per
device, joined in one torch.distributed process group (layout.py: which slice of every
tensor a shard holds; comm.py: the group; shard.py: a shard's collectives and the
leader's step announcements; group.py: N local shard processes driven from here;
proc.py: the shard process itself)."""
