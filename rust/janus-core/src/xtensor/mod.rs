//! xTensor: physical page pool, virtual regions and mapping backends (PAPER.md §7).
