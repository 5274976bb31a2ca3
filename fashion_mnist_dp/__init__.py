"""The harness that runs the experiment (lightning_modules/, datamodules/, callbacks/): the command line (cli), what
keeps a run safe (runtime) and the strategies Lightning 2.x lacks (strategies). docs/architecture.md says which is
which; the experiment never imports it."""
