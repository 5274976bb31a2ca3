"""The harness that runs the experiment: cli, runtime and strategies (docs/architecture.md)."""
