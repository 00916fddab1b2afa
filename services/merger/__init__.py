"""The merger: episode events in, training samples out (`timelines` → `assembler` → `handlers`)."""
