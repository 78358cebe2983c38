"""Wing: reports for people (`lb.explain`, `lb.sow_sites`, `lb.compare`)."""
