"""Performance predictions the dispatcher and (later) the controller use: pure, no I/O."""
