"""Planning: execution order, lifetimes, memory offsets, streams. Never mutates the graph."""
