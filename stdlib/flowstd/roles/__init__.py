"""Ready role implementations that the standard .flow modules name in their `impl`."""
