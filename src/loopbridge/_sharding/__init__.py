"""Wing: placing declared buffers on a mesh (`lb.sharding`)."""
