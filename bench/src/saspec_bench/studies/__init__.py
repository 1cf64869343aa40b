"""Studies: one-off measurements that chose a rule (run as ``python -m saspec_bench.studies.NAME``).

Like the commands, a study imports only the bench's shared layers, never a command."""
