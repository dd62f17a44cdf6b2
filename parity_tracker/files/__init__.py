"""Local on-disk formats: the versioned parity tables, tensor dumps, and atomic writes."""
