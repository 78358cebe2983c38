"""Wing: layer stacks and parameter layouts (`lb.layers`)."""
