"""The recording core: discover -> declare -> append -> read. It imports no wing."""
