"""janusd.lifecycle: model states, restore (H2D), fork (D2D) and worker-to-worker transfer (Mooncake)."""
