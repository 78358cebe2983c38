"""Wing: saving and restoring recorded models (`lb.checkpoint`)."""
