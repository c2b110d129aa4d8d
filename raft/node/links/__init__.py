"""The sink side of cross-cluster links (issue 30, docs/REPLICATION.md), one job a file:

- manager.py: which mirror partitions this node pulls (the ones it leads, of active links),
  pullers started and stopped on leadership and metadata changes, `write_refusal` on the
  groups of active mirrors, the status `link describe` and the metrics read;
- puller.py: one mirror partition: fetch from the source at `visible_end + 1`, append as
  MIRRORED (`RaftGroup.append_mirrored`), resync, bootstrap, report the position;
- grow.py: a mirror grows when its source topic does (the controller leader looks);
- source.py: one client per link to the source cluster (its TLS CA, its token);
- throttle.py: the node-wide bytes/s limit all pullers share (`--link-rate`).
"""
