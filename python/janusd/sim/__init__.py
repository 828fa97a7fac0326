"""The simulator: janusd's second shell (virtual clock, simulated workers); see docs/DESIGN.md "Simulator"."""
