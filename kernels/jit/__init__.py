"""JIT builder for the sm90 kernel."""
